package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Volumes of process pods, written once when the pod starts, under
// <pod folder>/volumes/<name>, as the kubelet's volume plugins would make
// them: emptyDir, hostPath, configMap, secret, downwardAPI and projected
// (with the service account token from the TokenRequest API, which is what
// every pod's kube-api-access volume holds). They are not refreshed when
// their ConfigMap or Secret changes. container-init mounts them at their
// mountPaths.

// prepareVolumes writes every volume; a missing ConfigMap or Secret that is
// not optional is a configError (the pod waits, as on a real node).
func (w *podWorker) prepareVolumes(ctx context.Context) error {
	pod := w.pod
	r := w.k.newRefs(ctx, pod.Namespace)
	root := filepath.Join(w.dir, "volumes")
	if err := os.RemoveAll(root); err != nil {
		return err
	}
	w.volumes = map[string]string{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(root, v.Name)
		if v.HostPath != nil {
			path := v.HostPath.Path
			if t := v.HostPath.Type; t != nil && *t == v1.HostPathDirectoryOrCreate {
				if err := os.MkdirAll(path, 0o755); err != nil {
					return err
				}
			}
			w.volumes[v.Name] = path
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		w.volumes[v.Name] = dir
		var err error
		switch {
		case v.EmptyDir != nil:
		case v.ConfigMap != nil:
			err = writeKeys(dir, r.configMap, "configmap", v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode)
		case v.Secret != nil:
			err = writeKeys(dir, r.secret, "secret", v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode)
		case v.DownwardAPI != nil:
			err = w.writeDownward(dir, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
		case v.Projected != nil:
			err = w.writeProjected(ctx, r, dir, v.Projected)
		default:
			err = &configError{fmt.Sprintf("volume %q: its type is not supported by this kubelet", v.Name)}
		}
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	return os.WriteFile(filepath.Join(w.dir, "etc-hosts"), []byte(w.hostsFile()), 0o644)
}

func writeKeys(dir string, get func(string) (map[string]string, error), kind, name string, items []v1.KeyToPath, optional *bool, mode *int32) error {
	data, err := get(name)
	if err != nil {
		return err
	}
	if data == nil {
		if optional != nil && *optional {
			return nil
		}
		return &configError{fmt.Sprintf("%s %q not found", kind, name)}
	}
	if len(items) == 0 {
		for key := range data {
			items = append(items, v1.KeyToPath{Key: key, Path: key})
		}
	}
	for _, it := range items {
		value, ok := data[it.Key]
		if !ok {
			if optional != nil && *optional {
				continue
			}
			return &configError{fmt.Sprintf("%s %q has no key %q", kind, name, it.Key)}
		}
		if err := writeFile(dir, it.Path, value, fileMode(it.Mode, mode)); err != nil {
			return err
		}
	}
	return nil
}

func fileMode(item, def *int32) os.FileMode {
	switch {
	case item != nil:
		return os.FileMode(*item)
	case def != nil:
		return os.FileMode(*def)
	}
	return 0o644
}

func writeFile(dir, rel, value string, mode os.FileMode) error {
	if rel == "" || filepath.IsAbs(rel) || strings.HasPrefix(filepath.Clean(rel), "..") {
		return &configError{fmt.Sprintf("volume path %q must be relative and inside the volume", rel)}
	}
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(value), mode)
}

func (w *podWorker) writeDownward(dir string, items []v1.DownwardAPIVolumeFile, mode *int32) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return &configError{fmt.Sprintf("downwardAPI %q: only fieldRef is supported", it.Path)}
		}
		var value string
		switch it.FieldRef.FieldPath {
		case "metadata.labels":
			value = formatMap(w.pod.Labels)
		case "metadata.annotations":
			value = formatMap(w.pod.Annotations)
		default:
			v, err := fieldValue(w.pod, w.ip, it.FieldRef.FieldPath)
			if err != nil {
				return err
			}
			value = v
		}
		if err := writeFile(dir, it.Path, value, fileMode(it.Mode, mode)); err != nil {
			return err
		}
	}
	return nil
}

// formatMap is the downward API's file format for labels and annotations.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.String()
}

func (w *podWorker) writeProjected(ctx context.Context, r *refs, dir string, p *v1.ProjectedVolumeSource) error {
	for _, src := range p.Sources {
		var err error
		switch {
		case src.ServiceAccountToken != nil:
			err = w.writeToken(ctx, dir, src.ServiceAccountToken, p.DefaultMode)
		case src.ConfigMap != nil:
			err = writeKeys(dir, r.configMap, "configmap", src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, p.DefaultMode)
		case src.Secret != nil:
			err = writeKeys(dir, r.secret, "secret", src.Secret.Name, src.Secret.Items, src.Secret.Optional, p.DefaultMode)
		case src.DownwardAPI != nil:
			err = w.writeDownward(dir, src.DownwardAPI.Items, p.DefaultMode)
		default:
			err = &configError{"a projected source of a type this kubelet does not support"}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeToken asks the API for a token bound to this pod, as the kubelet
// does for a serviceAccountToken projection.
func (w *podWorker) writeToken(ctx context.Context, dir string, src *v1.ServiceAccountTokenProjection, mode *int32) error {
	sa := w.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: w.pod.Name, UID: w.pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	tr, err := w.k.client.CoreV1().ServiceAccounts(w.pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service account token: %w", err)
	}
	return writeFile(dir, src.Path, tr.Status.Token, fileMode(nil, mode))
}

// hostsFile is the pod's /etc/hosts as the kubelet writes it, with one
// addition: each host alias also in its fully qualified form with the
// trailing dot. With no cluster DNS here the hosts file is the pods' only
// resolver, and Envoy's resolver (c-ares) matches "name." only to a line
// that lists "name." (Envoy Gateway's xDS address is written that way);
// DNS treats the two forms as one name.
func (w *podWorker) hostsFile() string {
	name := w.pod.Spec.Hostname
	if name == "" {
		name = w.pod.Name
	}
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	fmt.Fprintf(&b, "%s\t%s\n", w.ip, name)
	if w.k != nil && w.k.apiPort != 0 && w.k.net != nil {
		// What cluster DNS answers for the API server's Service; its
		// port 443 there is forwarded to the API server (setup).
		fmt.Fprintf(&b, "%s\t%s\n", w.k.net.gateway, strings.Join(apiServiceNames, "\t"))
	}
	if len(w.pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range w.pod.Spec.HostAliases {
			names := append([]string{}, a.Hostnames...)
			for _, h := range a.Hostnames {
				if strings.Contains(h, ".") && !strings.HasSuffix(h, ".") {
					names = append(names, h+".")
				}
			}
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(names, "\t"))
		}
	}
	return b.String()
}

// mountsOf is what container-init mounts for a container: its volumes and
// the pod's /etc/hosts.
func (w *podWorker) mountsOf(c *v1.Container, own map[string]string) ([]initMount, error) {
	var out []initMount
	hosts := true
	for _, m := range c.VolumeMounts {
		src, ok := w.volumes[m.Name]
		if !ok {
			return nil, &configError{fmt.Sprintf("volumeMount %q: no volume of that name", m.Name)}
		}
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = expand(m.SubPathExpr, func(n string) (string, bool) { v, ok := own[n]; return v, ok })
		}
		if sub != "" {
			if filepath.IsAbs(sub) || strings.HasPrefix(filepath.Clean(sub), "..") {
				return nil, &configError{fmt.Sprintf("volumeMount %q: subPath %q must stay inside the volume", m.Name, sub)}
			}
			src = filepath.Join(src, sub)
			if _, err := os.Stat(src); os.IsNotExist(err) {
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, err
				}
			}
		}
		if filepath.Clean(m.MountPath) == "/etc/hosts" {
			hosts = false
		}
		out = append(out, initMount{Volume: m.Name, Source: src, Target: m.MountPath, ReadOnly: m.ReadOnly})
	}
	if hosts {
		out = append(out, initMount{Volume: "etc-hosts", Source: filepath.Join(w.dir, "etc-hosts"), Target: "/etc/hosts"})
	}
	return out, nil
}

// imageFiles are the files the image map says the image carries, as
// read-only mounts that go before the volumes: mounts are made parents
// first and, at one depth, in order, so a volume at or above an image
// path covers it, as a volume covers an image's own folder.
func imageFiles(img imageConfig) []initMount {
	paths := make([]string, 0, len(img.Files))
	for p := range img.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	out := make([]initMount, 0, len(paths))
	for _, p := range paths {
		out = append(out, initMount{Volume: "image files " + p, Source: img.Files[p], Target: p, ReadOnly: true})
	}
	return out
}
