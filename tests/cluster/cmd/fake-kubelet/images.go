package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The image map: the ConfigMap (by default kube-system/fake-kubelet-images)
// whose keys each map image references to what that image would carry in
// its config. A key's name only says who wrote it (the workload scripts,
// a test suite), so writers do not overwrite each other; the same image in
// two keys is an error. A pod whose every container's image is in the map
// runs as processes on this machine; every other pod stays simulated.
//
//	data:
//	  openmed.yaml: |
//	    openmed/openmed-service:
//	      entrypoint: [/path/to/venv/bin/python, -m, openmed.service.logging]
//	      env: ["XDG_CONFIG_HOME=/path/to/config", "HF_HUB_OFFLINE=1"]
//	      workingDir: /path/to/workload
//	    ghcr.io/maziyarpanahi/openmed-operator:
//	      cmd: [kopf, run, /app/openmed_operator.py]
//	      env: ["PATH=/path/to/kopf/venv/bin:/usr/bin:/bin"]
//	      files: {/app: /path/to/the/operator's/files}
//
// files are what the image would carry at paths of its own: each machine
// path is bind-mounted read-only at its image path, under the pod's
// volumes (a volume at the same path or above it covers it, as a volume
// covers an image's folder).
// A reference matches an entry written with its tag or digest, or the
// entry for its repository without one ("openmed/openmed-service:3.1.0"
// uses "openmed/openmed-service" when there is no entry of its own).

// imageConfig is the part of an OCI image config a container start uses.
type imageConfig struct {
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// Env is "NAME=value" lines, underneath the container's own env.
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	// Files maps a path in the image to the machine's file or folder
	// that holds it.
	Files map[string]string `json:"files,omitempty"`
}

type imageMap map[string]imageConfig

func parseImageMap(data map[string]string) (imageMap, error) {
	m := imageMap{}
	from := map[string]string{}
	keys := make([]string, 0, len(data))
	for key := range data {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		part := imageMap{}
		if err := yaml.UnmarshalStrict([]byte(data[key]), &part); err != nil {
			return nil, fmt.Errorf("key %s: %w", key, err)
		}
		for ref, cfg := range part {
			if len(cfg.Entrypoint) == 0 && len(cfg.Cmd) == 0 {
				return nil, fmt.Errorf("key %s: image %q has neither entrypoint nor cmd", key, ref)
			}
			for _, e := range cfg.Env {
				if !strings.Contains(e, "=") {
					return nil, fmt.Errorf("key %s: image %q: env entry %q is not NAME=value", key, ref, e)
				}
			}
			for at, source := range cfg.Files {
				if !filepath.IsAbs(at) || filepath.Clean(at) != at || at == "/" {
					return nil, fmt.Errorf("key %s: image %q: files: %q is not a clean absolute path below /", key, ref, at)
				}
				if !filepath.IsAbs(source) {
					return nil, fmt.Errorf("key %s: image %q: files: %s: %q is not an absolute path on this machine", key, ref, at, source)
				}
			}
			if other, dup := from[ref]; dup {
				return nil, fmt.Errorf("image %q is in both key %s and key %s", ref, other, key)
			}
			m[ref], from[ref] = cfg, key
		}
	}
	return m, nil
}

// lookup finds the entry for an image reference.
func (m imageMap) lookup(ref string) (imageConfig, bool) {
	if cfg, ok := m[ref]; ok {
		return cfg, true
	}
	repo := ref
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	// A tag follows the last ":" after the last "/" (a registry port does not).
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	cfg, ok := m[repo]
	return cfg, ok
}

// processImages returns the image config of every container (init
// containers first) when all of them are in the map. When only some are, it
// says which is missing: such a pod can run neither way.
func (m imageMap) processImages(pod *v1.Pod) (map[string]imageConfig, bool, error) {
	all := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	found := map[string]imageConfig{}
	var missing []string
	for _, c := range all {
		if cfg, ok := m.lookup(c.Image); ok {
			found[c.Name] = cfg
		} else {
			missing = append(missing, fmt.Sprintf("%s (%s)", c.Name, c.Image))
		}
	}
	switch {
	case len(found) == 0:
		return nil, false, nil
	case len(missing) > 0:
		return nil, false, fmt.Errorf("containers %s have images that are not in the image map, and the others' are: a pod runs either all as processes or all simulated", strings.Join(missing, ", "))
	}
	return found, true, nil
}

// nodeForwardPorts reads the ports of this machine that process pods
// reach at their gateway address: every key of the node ConfigMap lists
// some (numbers separated by spaces, commas or lines; the key's name says
// who wrote them, as in the image map), and the API server's port is
// always one. No ConfigMap means that one alone.
func (k *kubelet) nodeForwardPorts(ctx context.Context) ([]int, error) {
	var ports []int
	// The API server, for in-cluster clients (apiServerEnv).
	if k.apiPort != 0 {
		ports = append(ports, k.apiPort)
	}
	cm, err := k.client.CoreV1().ConfigMaps(k.nodeCMNS).Get(ctx, k.nodeCMName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ports, nil
	} else if err != nil {
		return nil, err
	}
	for key, value := range cm.Data {
		for _, f := range strings.FieldsFunc(value, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
			p, err := strconv.Atoi(f)
			if err != nil || p < 1 || p > 65535 {
				return nil, fmt.Errorf("ConfigMap %s/%s: key %s: %q is not a port", k.nodeCMNS, k.nodeCMName, key, f)
			}
			ports = append(ports, p)
		}
	}
	sort.Ints(ports)
	return ports, nil
}

// readImageMap is a quorum read, so a map written just before a pod was
// created applies to it. No ConfigMap means no process pods.
func (k *kubelet) readImageMap(ctx context.Context) (imageMap, error) {
	if k.imagesName == "" {
		return imageMap{}, nil
	}
	cm, err := k.client.CoreV1().ConfigMaps(k.imagesNS).Get(ctx, k.imagesName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return imageMap{}, nil
	} else if err != nil {
		return nil, err
	}
	m, err := parseImageMap(cm.Data)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w", k.imagesNS, k.imagesName, err)
	}
	return m, nil
}
