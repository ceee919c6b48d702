package main

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestExpandFollowsTheAPIRules(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "two", "EMPTY": ""}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for in, want := range map[string]string{
		"plain":         "plain",
		"$(A)":          "1",
		"x$(A)y$(B)z":   "x1ytwoz",
		"$$(A)":         "$(A)",
		"$$":            "$",
		"$(UNKNOWN)":    "$(UNKNOWN)",
		"$(EMPTY)-":     "-",
		"$(A":           "$(A",
		"$A":            "$A",
		"end$":          "end$",
		"$$$(A)":        "$1",
		"$()":           "$()",
		"a $(A) $(A) b": "a 1 1 b",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRestartDelayIsTheKubeletsBackOff(t *testing.T) {
	max := 300 * time.Second
	var got []time.Duration
	for i := range 9 {
		got = append(got, restartDelay(i, max))
	}
	s := time.Second
	want := []time.Duration{0, 10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s, 300 * s}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("delays %v, want %v", got, want)
	}
	if d := restartDelay(3, 5*time.Second); d != 5*time.Second {
		t.Errorf("a lower maximum caps the first delay too: %v", d)
	}
}

func TestTerminationMessageIsTheLogsTail(t *testing.T) {
	var lines []string
	for i := range 100 {
		lines = append(lines, "line "+strings.Repeat("x", i%3)+string(rune('a'+i%26)))
	}
	got := tailOf(strings.Join(lines, "\n") + "\n")
	if n := len(strings.Split(got, "\n")); n != 80 {
		t.Errorf("%d lines, want the last 80", n)
	}
	if !strings.HasSuffix(got, lines[99]) {
		t.Errorf("does not end with the last line: %q", got[len(got)-20:])
	}
	long := strings.Repeat("y", 5000) + "\nlast"
	if got := tailOf(long); len(got) != 2048 || !strings.HasSuffix(got, "\nlast") {
		t.Errorf("not cut to the last 2048 bytes: %d", len(got))
	}
}

func TestImageLookupFallsBackToTheRepository(t *testing.T) {
	m, err := parseImageMap(map[string]string{
		"a.yaml": "openmed/openmed-service:\n  entrypoint: [/bin/true]\n",
		"b.yaml": "registry:5000/tool:v2:\n  cmd: [/bin/false]\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]bool{
		"openmed/openmed-service":                 true,
		"openmed/openmed-service:3.1.0":           true,
		"openmed/openmed-service@sha256:abcd":     true,
		"openmed/openmed-service:3.1.0@sha256:ab": true,
		"registry:5000/tool:v2":                   true,
		"registry:5000/tool":                      false,
		"openmed/other":                           false,
	} {
		if _, ok := m.lookup(ref); ok != want {
			t.Errorf("lookup(%q) = %v, want %v", ref, ok, want)
		}
	}
}

func TestImageMapErrorsNameTheKey(t *testing.T) {
	for data, want := range map[string]string{
		"x: {entrypoint: [a]}\n":           "",
		"x: {}\n":                          "key k.yaml: image \"x\" has neither entrypoint nor cmd",
		"x: {cmd: [a], env: [NOEQUALS]}\n": "not NAME=value",
		"x: {cmd: [a], entrypont: [b]}\n":  "unknown field",
		"x: {cmd: [a]}\nx: {cmd: [b]}\n":   "already set",
		"- not\n- a map\n":                 "cannot unmarshal",
	} {
		_, err := parseImageMap(map[string]string{"k.yaml": data})
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", data, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", data, err, want)
		}
	}
	_, err := parseImageMap(map[string]string{"a.yaml": "x: {cmd: [a]}", "b.yaml": "x: {cmd: [b]}"})
	if err == nil || !strings.Contains(err.Error(), `image "x" is in both key a.yaml and key b.yaml`) {
		t.Errorf("duplicate across keys: %v", err)
	}
}

func TestAPodRunsAllAsProcessesOrNone(t *testing.T) {
	m := imageMap{"proc": {Cmd: []string{"x"}}}
	pod := func(images ...string) *v1.Pod {
		p := &v1.Pod{}
		for i, img := range images {
			c := v1.Container{Name: string(rune('a' + i)), Image: img}
			if i == 0 && len(images) > 1 {
				p.Spec.InitContainers = append(p.Spec.InitContainers, c)
			} else {
				p.Spec.Containers = append(p.Spec.Containers, c)
			}
		}
		return p
	}
	if _, ok, err := m.processImages(pod("proc", "proc:1")); !ok || err != nil {
		t.Errorf("all mapped: %v %v", ok, err)
	}
	if _, ok, err := m.processImages(pod("other")); ok || err != nil {
		t.Errorf("none mapped is simulated: %v %v", ok, err)
	}
	if _, ok, err := m.processImages(pod("proc", "other")); ok || err == nil || !strings.Contains(err.Error(), "b (other)") {
		t.Errorf("mixed is refused, naming the container: %v %v", ok, err)
	}
}

func TestArgvReplacesEntrypointAndCmdAsTheRuntimeDoes(t *testing.T) {
	img := imageConfig{Entrypoint: []string{"/ep"}, Cmd: []string{"--default"}}
	own := map[string]string{"PORT": "8080"}
	for _, tc := range []struct {
		cmd, args, want []string
	}{
		{nil, nil, []string{"/ep", "--default"}},
		{nil, []string{"--port", "$(PORT)"}, []string{"/ep", "--port", "8080"}},
		{[]string{"/other"}, nil, []string{"/other"}},
		{[]string{"/other", "$(PORT)"}, []string{"$$(PORT)"}, []string{"/other", "8080", "$(PORT)"}},
	} {
		c := v1.Container{Command: tc.cmd, Args: tc.args}
		if got := argv(&c, img, own); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("command %v args %v: %v, want %v", tc.cmd, tc.args, got, tc.want)
		}
	}
}

func TestContainerEnvLayersAndExpands(t *testing.T) {
	client := fake.NewClientset(
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"MODEL": "OpenMed/m-v1", "B": "from-cm"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sec"}, Data: map[string][]byte{"TOKEN": []byte("s3cret")}},
	)
	k := &kubelet{client: client}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-1", UID: "u-1", Labels: map[string]string{"app": "svc"}}}
	c := v1.Container{
		EnvFrom: []v1.EnvFromSource{{Prefix: "CM_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}},
		Env: []v1.EnvVar{
			{Name: "IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "APP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "MODEL", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "MODEL"}}},
			{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "TOKEN"}}},
			{Name: "URL", Value: "http://$(IP):8080/$(CM_B)/$(FROM_IMAGE)"},
			{Name: "HOME", Value: "/override"},
		},
	}
	img := imageConfig{Env: []string{"HOME=/image", "FROM_IMAGE=img", "PATH=/venv/bin"}}
	env, own, err := containerEnv(k.newRefs(context.Background(), "ns"), pod, "10.244.0.7", &c, img)
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(t, env)
	want := map[string]string{
		"CM_MODEL": "OpenMed/m-v1", "CM_B": "from-cm",
		"IP": "10.244.0.7", "NAME": "p-1", "APP": "svc", "MODEL": "OpenMed/m-v1", "TOKEN": "s3cret",
		// Image variables are not visible to $(VAR): only the container's own are.
		"URL":  "http://10.244.0.7:8080/from-cm/$(FROM_IMAGE)",
		"HOME": "/override", "FROM_IMAGE": "img", "PATH": "/venv/bin", "HOSTNAME": "p-1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("env\n got %v\nwant %v", got, want)
	}
	if own["URL"] != want["URL"] || own["FROM_IMAGE"] != "" {
		t.Errorf("own variables: %v", own)
	}

	missing := v1.Container{Env: []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "NOPE"}}}}}
	_, _, err = containerEnv(k.newRefs(context.Background(), "ns"), pod, "10.244.0.7", &missing, imageConfig{})
	if _, ok := err.(*configError); !ok || !strings.Contains(err.Error(), "couldn't find key NOPE in ConfigMap ns/cm") {
		t.Errorf("a missing key is a config error, as the kubelet says it: %v", err)
	}
}

func TestContainersFindTheAPIServerAtTheirGateway(t *testing.T) {
	network, err := newPodNetwork("fk-t", "10.244.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{client: fake.NewClientset(), net: network, apiPort: 6443, nodeCMNS: "kube-system", nodeCMName: "fake-kubelet-node"}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-1"}}
	// The image's value gives way to the kubelet's, the container's own
	// to nothing.
	img := imageConfig{Env: []string{"KUBERNETES_SERVICE_HOST=image.example", "KUBERNETES_PORT=tcp://image.example:1"}}
	c := v1.Container{Env: []v1.EnvVar{{Name: "KUBERNETES_SERVICE_PORT_HTTPS", Value: "7443"}}}
	env, _, err := containerEnv(k.newRefs(context.Background(), "ns"), pod, "10.244.0.7", &c, img)
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(t, env)
	for name, want := range map[string]string{
		"KUBERNETES_SERVICE_HOST":       "10.244.0.1",
		"KUBERNETES_SERVICE_PORT":       "6443",
		"KUBERNETES_SERVICE_PORT_HTTPS": "7443",
		"KUBERNETES_PORT":               "tcp://10.244.0.1:6443",
	} {
		if got[name] != want {
			t.Errorf("%s=%q, want %q (env %v)", name, got[name], want, env)
		}
	}
	ports, err := k.nodeForwardPorts(context.Background())
	if err != nil || !reflect.DeepEqual(ports, []int{6443}) {
		t.Errorf("without a node ConfigMap pods still reach the API server: %v, %v", ports, err)
	}
	for server, want := range map[string]int{"https://127.0.0.1:35011": 35011, "https://localhost": 443, "http://127.0.0.1": 80} {
		if got, err := serverPort(server); err != nil || got != want {
			t.Errorf("serverPort(%q) = %d, %v; want %d", server, got, err, want)
		}
	}
}

func TestPodNamespacesAreNamedByAddress(t *testing.T) {
	n, err := newPodNetwork("fk-1", "10.244.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	if n.gateway.String() != "10.244.0.1" {
		t.Errorf("gateway %s", n.gateway)
	}
	for ip, want := range map[string]string{"10.244.0.2": "fk-1-2", "10.244.1.0": "fk-1-256", "10.244.255.254": "fk-1-65534"} {
		if got := n.podNS(ip); got != want {
			t.Errorf("podNS(%s) = %s, want %s", ip, got, want)
		}
	}
}

func TestHostsFileHasThePodAndItsAliases(t *testing.T) {
	w := &podWorker{ip: "10.244.0.9", pod: &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "envoy-abc"},
		Spec:       v1.PodSpec{HostAliases: []v1.HostAlias{{IP: "10.244.0.1", Hostnames: []string{"envoy-gateway", "envoy-gateway.envoy-gateway-system.svc.cluster.local"}}}},
	}}
	got := w.hostsFile()
	for _, line := range []string{"127.0.0.1\tlocalhost", "10.244.0.9\tenvoy-abc", "10.244.0.1\tenvoy-gateway\tenvoy-gateway.envoy-gateway-system.svc.cluster.local\tenvoy-gateway.envoy-gateway-system.svc.cluster.local."} {
		if !strings.Contains(got, line+"\n") {
			t.Errorf("no %q in\n%s", line, got)
		}
	}
}

func TestDownwardAPIFilesFormatMapsAsTheKubeletDoes(t *testing.T) {
	got := formatMap(map[string]string{"b": "two words", "a": `q"uote`})
	if want := "a=\"q\\\"uote\"\nb=\"two words\"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestVolumeKeysAreWrittenWithTheirModesAndPaths(t *testing.T) {
	dir := t.TempDir()
	data := map[string]string{"tls.crt": "CERT", "tls.key": "KEY"}
	get := func(string) (map[string]string, error) { return data, nil }
	mode := int32(0o600)
	if err := writeKeys(dir, get, "secret", "envoy", []v1.KeyToPath{{Key: "tls.key", Path: "keys/tls.key", Mode: &mode}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(dir, "keys/tls.key"))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("item path and mode: %v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tls.crt")); err == nil {
		t.Error("items select keys: tls.crt should not be there")
	}
	err = writeKeys(dir, get, "secret", "envoy", []v1.KeyToPath{{Key: "x", Path: "../escape"}}, nil, nil)
	if err == nil {
		t.Error("a missing key is an error")
	}
	data["x"] = "v"
	if err := writeKeys(dir, get, "secret", "envoy", []v1.KeyToPath{{Key: "x", Path: "../escape"}}, nil, nil); err == nil {
		t.Error("a path out of the volume is refused")
	}
	none := func(string) (map[string]string, error) { return nil, nil }
	opt := true
	if err := writeKeys(dir, none, "configmap", "gone", nil, &opt, nil); err != nil {
		t.Errorf("an optional missing ConfigMap is fine: %v", err)
	}
	if err := writeKeys(dir, none, "configmap", "gone", nil, nil, nil); err == nil || err.Error() != `configmap "gone" not found` {
		t.Errorf("a missing ConfigMap: %v", err)
	}
}

// envMap reads NAME=value lines into a map, failing on a name set twice.
func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, line := range env {
		name, value, _ := strings.Cut(line, "=")
		if _, dup := got[name]; dup {
			t.Errorf("%s set twice in %v", name, env)
		}
		got[name] = value
	}
	return got
}
