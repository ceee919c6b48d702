package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The environment of a process container, built the way the kubelet and
// the container runtime build it: the image's env underneath, then envFrom
// in order, then env in order, each env value expanded with $(VAR) against
// what came before it (not against the image's env); command and args are
// expanded against the result. Of the service links only the API server's
// are made (KUBERNETES_SERVICE_HOST, _PORT, as a real kubelet gives every
// container): in-cluster clients need them; nothing here reads the others.

// defaultPath is what container runtimes set when the image has no PATH.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// refs reads ConfigMaps and Secrets of one pod at container start, each at
// most once.
type refs struct {
	ctx     context.Context
	k       *kubelet
	ns      string
	cms     map[string]*v1.ConfigMap
	secrets map[string]*v1.Secret
}

func (k *kubelet) newRefs(ctx context.Context, ns string) *refs {
	return &refs{ctx: ctx, k: k, ns: ns, cms: map[string]*v1.ConfigMap{}, secrets: map[string]*v1.Secret{}}
}

func (r *refs) configMap(name string) (map[string]string, error) {
	if cm, ok := r.cms[name]; ok {
		return dataOf(cm), nil
	}
	cm, err := r.k.client.CoreV1().ConfigMaps(r.ns).Get(r.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	r.cms[name] = cm
	return dataOf(cm), nil
}

func dataOf(cm *v1.ConfigMap) map[string]string {
	if cm == nil {
		return nil
	}
	if cm.Data == nil {
		return map[string]string{}
	}
	return cm.Data
}

func (r *refs) secret(name string) (map[string]string, error) {
	s, ok := r.secrets[name]
	if !ok {
		var err error
		s, err = r.k.client.CoreV1().Secrets(r.ns).Get(r.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			s, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		r.secrets[name] = s
	}
	if s == nil {
		return nil, nil
	}
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out, nil
}

// containerEnv returns the process environment ("NAME=value") and the
// container's own variables for expanding command and args.
func containerEnv(r *refs, pod *v1.Pod, podIP string, c *v1.Container, img imageConfig) ([]string, map[string]string, error) {
	own := map[string]string{}
	var order []string
	set := func(name, value string) {
		if _, ok := own[name]; !ok {
			order = append(order, name)
		}
		own[name] = value
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		var err error
		var kind, name string
		var optional bool
		switch {
		case from.ConfigMapRef != nil:
			kind, name = "configmap", from.ConfigMapRef.Name
			optional = from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional
			data, err = r.configMap(name)
		case from.SecretRef != nil:
			kind, name = "secret", from.SecretRef.Name
			optional = from.SecretRef.Optional != nil && *from.SecretRef.Optional
			data, err = r.secret(name)
		default:
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if data == nil {
			if optional {
				continue
			}
			return nil, nil, &configError{fmt.Sprintf("%s %q not found", kind, name)}
		}
		keys := make([]string, 0, len(data))
		for key := range data {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			set(from.Prefix+key, data[key])
		}
	}
	lookup := func(name string) (string, bool) {
		v, ok := own[name]
		return v, ok
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, lookup))
			continue
		}
		v, ok, err := valueFrom(r, pod, podIP, e.ValueFrom)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			set(e.Name, v)
		}
	}

	// The kubelet's variables override the image's, the container's own
	// override both.
	var env []string
	kubeletEnv := map[string]string{}
	var kubeletOrder []string
	for _, line := range r.k.apiServerEnv() {
		name, value, _ := strings.Cut(line, "=")
		kubeletEnv[name] = value
		kubeletOrder = append(kubeletOrder, name)
	}
	hasPath := false
	for _, line := range img.Env {
		name, _, _ := strings.Cut(line, "=")
		if _, overridden := own[name]; overridden {
			continue
		}
		if _, overridden := kubeletEnv[name]; overridden {
			continue
		}
		hasPath = hasPath || name == "PATH"
		env = append(env, line)
	}
	for _, name := range kubeletOrder {
		if _, overridden := own[name]; !overridden {
			env = append(env, name+"="+kubeletEnv[name])
		}
	}
	if _, ok := own["PATH"]; !ok && !hasPath {
		env = append(env, defaultPath)
	}
	if _, ok := own["HOSTNAME"]; !ok {
		env = append(env, "HOSTNAME="+pod.Name)
	}
	for _, name := range order {
		env = append(env, name+"="+own[name])
	}
	return env, own, nil
}

// The API server's Service, as cluster DNS and the Service would give it:
// its names, each in the pod's hosts file at the pods' gateway, and its
// port there, forwarded to the API server's own.
var apiServiceNames = []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

const apiServicePort = 443

// apiServerEnv is where in-cluster clients find the API server. A real
// kubelet names the `kubernetes` Service's cluster IP; no cluster IP routes
// anywhere here, so it names the pods' gateway and the API server's own
// port, which every process pod reaches there (nodeForwardPorts), and whose
// serving certificate names that address (tests/cluster/up). Empty when
// the kubelet runs no pod network (its unit tests).
func (k *kubelet) apiServerEnv() []string {
	if k.apiPort == 0 || k.net == nil {
		return nil
	}
	host, port := k.net.gateway.String(), strconv.Itoa(k.apiPort)
	addr := "tcp://" + net.JoinHostPort(host, port)
	return []string{
		"KUBERNETES_SERVICE_HOST=" + host,
		"KUBERNETES_SERVICE_PORT=" + port,
		"KUBERNETES_SERVICE_PORT_HTTPS=" + port,
		"KUBERNETES_PORT=" + addr,
	}
}

// serverPort is the port of an API server URL (443 when it names none).
func serverPort(server string) (int, error) {
	u, err := url.Parse(server)
	if err != nil {
		return 0, err
	}
	if u.Port() == "" {
		if u.Scheme == "http" {
			return 80, nil
		}
		return 443, nil
	}
	return strconv.Atoi(u.Port())
}

func valueFrom(r *refs, pod *v1.Pod, podIP string, src *v1.EnvVarSource) (string, bool, error) {
	switch {
	case src.FieldRef != nil:
		v, err := fieldValue(pod, podIP, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		return keyValue(r.configMap, "ConfigMap", pod.Namespace, ref.Name, ref.Key, ref.Optional)
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		return keyValue(r.secret, "Secret", pod.Namespace, ref.Name, ref.Key, ref.Optional)
	case src.ResourceFieldRef != nil:
		return "", false, &configError{fmt.Sprintf("resourceFieldRef %q: this kubelet runs processes without resource limits", src.ResourceFieldRef.Resource)}
	}
	return "", false, nil
}

func keyValue(get func(string) (map[string]string, error), kind, ns, name, key string, opt *bool) (string, bool, error) {
	optional := opt != nil && *opt
	data, err := get(name)
	if err != nil {
		return "", false, err
	}
	if data == nil {
		if optional {
			return "", false, nil
		}
		return "", false, &configError{fmt.Sprintf("%s %q not found", strings.ToLower(kind), name)}
	}
	v, ok := data[key]
	if !ok && !optional {
		return "", false, &configError{fmt.Sprintf("couldn't find key %s in %s %s/%s", key, kind, ns, name)}
	}
	return v, ok, nil
}

// fieldValue answers the downward API's fieldRef paths.
func fieldValue(pod *v1.Pod, podIP, path string) (string, error) {
	if inner, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(inner, "']")], nil
	}
	if inner, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(inner, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	case "status.podIP", "status.podIPs":
		return podIP, nil
	}
	return "", &configError{fmt.Sprintf("fieldRef %q is not supported", path)}
}

// expand replaces $(NAME) with the variable's value. "$$" is a literal "$"
// (so "$$(NAME)" stays "$(NAME)"), a reference to an unknown variable and
// an unclosed "$(" are kept as written: the rules of the Kubernetes API
// for env values, command and args.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; next {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
			b.WriteByte(next)
			i++
		}
	}
	return b.String()
}

// argv is what the runtime executes: command replaces the image's
// entrypoint (and drops its cmd); args replace the cmd.
func argv(c *v1.Container, img imageConfig, own map[string]string) []string {
	lookup := func(name string) (string, bool) {
		v, ok := own[name]
		return v, ok
	}
	var out []string
	cmd, args := img.Entrypoint, img.Cmd
	if len(c.Command) > 0 {
		cmd, args = nil, nil
		for _, a := range c.Command {
			cmd = append(cmd, expand(a, lookup))
		}
	}
	if len(c.Args) > 0 {
		args = nil
		for _, a := range c.Args {
			args = append(args, expand(a, lookup))
		}
	}
	out = append(out, cmd...)
	return append(out, args...)
}
