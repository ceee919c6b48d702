package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The test binary is also container-init, as the kubelet's own binary is,
// so a test can start a container for real. Needs root (a mount namespace).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "container-init" {
		containerInit(os.Args[2:]) // does not return
	}
	os.Exit(m.Run())
}

// A volume mounted over the folder the pod's own files live in (Envoy's
// emptyDir at /tmp, with the checkout under /tmp) must not hide the
// sources of the volumes mounted after it, nor the scratch folder.
func TestAVolumeOverThePodsFolderHidesNoOtherSource(t *testing.T) {
	dir := t.TempDir()
	pod := filepath.Join(dir, "pod")
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(pod, "volumes/tmp/in-tmp"), "the emptyDir\n")
	write(filepath.Join(pod, "etc-hosts"), "the pod's hosts\n")
	write(filepath.Join(pod, "volumes/config/app.conf"), "the config\n")
	spec := initSpec{
		Mounts: []initMount{
			{Volume: "config", Source: filepath.Join(pod, "volumes/config"), Target: filepath.Join(dir, "etc/config"), ReadOnly: true},
			{Volume: "hosts", Source: filepath.Join(pod, "etc-hosts"), Target: filepath.Join(dir, "hosts")},
			{Volume: "tmp", Source: filepath.Join(pod, "volumes/tmp"), Target: dir},
		},
		// Under the emptyDir's mountPath too, and needed after it is
		// mounted: the new mountPaths are made on a shadow.
		Scratch: filepath.Join(pod, "scratch"),
		Dir:     dir,
		Argv:    []string{"cat", "in-tmp", "hosts", "etc/config/app.conf"},
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(t.TempDir(), "init.json")
	if err := os.WriteFile(specPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(os.Args[0], "container-init", specPath).CombinedOutput()
	if err != nil {
		t.Fatalf("container-init: %v\n%s", err, out)
	}
	if want := "the emptyDir\nthe pod's hosts\nthe config\n"; string(out) != want {
		t.Errorf("the container sees\n%s\nwant\n%s", out, want)
	}
	// The new mountPaths were made on the shadow, not in the volume.
	entries, err := os.ReadDir(filepath.Join(pod, "volumes/tmp"))
	if err != nil || len(entries) != 1 {
		t.Errorf("the emptyDir holds only its own file: %v %v", entries, err)
	}
}

// A source that is not there is named with its volume and mountPath.
func TestAMissingSourceNamesItsVolume(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "pod/etc-hosts")
	raw, err := json.Marshal(initSpec{
		Mounts:  []initMount{{Volume: "etc-hosts", Source: missing, Target: "/etc/hosts"}},
		Scratch: filepath.Join(dir, "scratch"),
		Argv:    []string{"true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(dir, "init.json")
	if err := os.WriteFile(specPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(os.Args[0], "container-init", specPath).CombinedOutput()
	want := "container-init: volume etc-hosts at /etc/hosts: source " + missing + ": no such file or directory\n"
	if err == nil || string(out) != want {
		t.Errorf("%v: %q, want %q", err, out, want)
	}
}

// The files the image map says an image carries are mounted read-only at
// their image paths, under the volumes: a path the machine lacks (the
// earlier operator's /app) is made without touching the machine, and a
// volume over an image folder covers it.
func TestImageFilesAreMountedUnderTheVolumes(t *testing.T) {
	dir := t.TempDir()
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "image/app/operator.py"), "the operator\n")
	write(filepath.Join(dir, "image/etc/config.yaml"), "the image's config\n")
	write(filepath.Join(dir, "pod/volumes/config/config.yaml"), "the volume's config\n")
	app := "/openmed-image-files-test"
	if _, err := os.Stat(app); !os.IsNotExist(err) {
		t.Fatalf("%s exists on this machine: %v", app, err)
	}
	etc := filepath.Join(dir, "etc")
	img := imageConfig{Cmd: []string{"x"}, Files: map[string]string{
		app: filepath.Join(dir, "image/app"),
		etc: filepath.Join(dir, "image/etc"),
	}}
	spec := initSpec{
		Mounts: append(imageFiles(img),
			initMount{Volume: "config", Source: filepath.Join(dir, "pod/volumes/config"), Target: etc}),
		Scratch: filepath.Join(dir, "pod/scratch"),
		Dir:     "/",
		Argv: []string{"sh", "-c", `cat "$1/operator.py" "$2/config.yaml"; ` +
			`if touch "$1/new" 2>/dev/null; then echo writable; fi`, "sh", app, etc},
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(t.TempDir(), "init.json")
	if err := os.WriteFile(specPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(os.Args[0], "container-init", specPath).CombinedOutput()
	if err != nil {
		t.Fatalf("container-init: %v\n%s", err, out)
	}
	if want := "the operator\nthe volume's config\n"; string(out) != want {
		t.Errorf("the container sees\n%s\nwant\n%s", out, want)
	}
	if _, err := os.Stat(app); !os.IsNotExist(err) {
		t.Errorf("the image path was made on the machine: %v", err)
	}
}

func TestImageFilesMustBeAbsolutePaths(t *testing.T) {
	for data, want := range map[string]string{
		"x: {cmd: [a], files: {/app: /src}}\n":      "",
		"x: {cmd: [a], files: {app: /src}}\n":       `files: "app" is not a clean absolute path`,
		"x: {cmd: [a], files: {/app/../b: /src}}\n": "is not a clean absolute path",
		"x: {cmd: [a], files: {/: /src}}\n":         "is not a clean absolute path",
		"x: {cmd: [a], files: {/app: src}}\n":       `"src" is not an absolute path on this machine`,
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
}
