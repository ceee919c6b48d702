package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// container-init: the first program of every process container. The
// kubelet starts it inside the pod's network namespace as
//
//	ip netns exec <pod namespace> fake-kubelet container-init SPEC.json
//
// and it makes the container's view of the filesystem before it executes
// the container's command in its place (same pid): a mount namespace of its
// own in which every volume is bind-mounted at its mountPath and the pod's
// /etc/hosts over the machine's. Sources are opened before the first mount,
// so a volume mounted over the folder that holds the pod's files (an
// emptyDir at /tmp) hides none of them. Everything else is the machine's own
// filesystem, writable as it is. A mountPath that does not exist (/certs)
// is made without touching the machine: its nearest existing parent is
// shadowed by a tmpfs holding bind mounts of that parent's entries, plus
// the new one.

type initSpec struct {
	Mounts []initMount `json:"mounts"`
	// Scratch is a folder of the pod's where shadows are mounted.
	Scratch string   `json:"scratch"`
	Dir     string   `json:"dir"`
	Argv    []string `json:"argv"`
}

type initMount struct {
	// Volume names the mount in errors: the pod's volume, or etc-hosts.
	Volume   string `json:"volume"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func containerInit(args []string) {
	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "container-init: "+format+"\n", a...)
		os.Exit(128)
	}
	if len(args) != 1 {
		fail("usage: fake-kubelet container-init SPEC.json")
	}
	raw, err := os.ReadFile(args[0])
	if err != nil {
		fail("%v", err)
	}
	var spec initSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		fail("%s: %v", args[0], err)
	}
	if len(spec.Argv) == 0 {
		fail("no command")
	}
	// Mount namespaces belong to threads: all of this, and the exec, on one.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		fail("unshare: %v", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fail("making mounts private: %v", err)
	}
	// Parents before children, so a mount inside another volume lands on it.
	sort.SliceStable(spec.Mounts, func(i, j int) bool {
		return depth(spec.Mounts[i].Target) < depth(spec.Mounts[j].Target)
	})
	// Every source, and the scratch folder, is opened before the first
	// mount and mounted from its open handle: a volume mounted over a
	// folder hides the paths beneath it (Envoy's emptyDir at /tmp hides a
	// pod kept under /tmp), not what is already open. Opened here, after
	// the unshare, as a bind mount's source must be in this namespace.
	if err := os.MkdirAll(spec.Scratch, 0o755); err != nil {
		fail("scratch: %v", err)
	}
	scratch, err := openPath(spec.Scratch)
	if err != nil {
		fail("scratch %s: %v", spec.Scratch, err)
	}
	fs := &shadowFS{scratch: scratch, shadowed: map[string]bool{}}
	sources := make([]string, len(spec.Mounts))
	isDir := make([]bool, len(spec.Mounts))
	for i, m := range spec.Mounts {
		src, err := openPath(m.Source)
		var info os.FileInfo
		if err == nil {
			info, err = os.Stat(src)
		}
		if err != nil {
			fail("volume %s at %s: source %s: %v", m.Volume, m.Target, m.Source, err)
		}
		sources[i], isDir[i] = src, info.IsDir()
	}
	// The program is found before the first mount too, for the same
	// reason: a volume over a folder that holds it (Envoy Gateway's
	// shutdown-manager, `envoy-gateway` from a tool cache under /tmp, and
	// its emptyDir at /tmp) must not hide what the container runs, as an
	// image's own files are never hidden by its volumes. A name relative
	// to the working folder is found after the chdir below.
	program, err := findProgram(spec.Argv[0])
	if err != nil {
		fail("%v", err)
	}
	for i, m := range spec.Mounts {
		target, err := fs.mountpoint(m.Target, isDir[i])
		if err != nil {
			fail("volume %s at %s: %v", m.Volume, m.Target, err)
		}
		if err := unix.Mount(sources[i], target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			fail("volume %s at %s: mounting %s: %v", m.Volume, m.Target, m.Source, err)
		}
		if m.ReadOnly {
			if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				fail("volume %s at %s: making it read-only: %v", m.Volume, m.Target, err)
			}
		}
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	if err := os.Chdir(dir); err != nil {
		fail("workingDir: %v", err)
	}
	path := ""
	if program == nil {
		if path, err = exec.LookPath(spec.Argv[0]); err != nil {
			fail("%v", err)
		}
	} else {
		path = program.path()
	}
	err = syscall.Exec(path, spec.Argv, os.Environ())
	fail("exec %s: %v", path, err)
}

// foundProgram is an executable found on PATH before the mounts, held
// open.
type foundProgram struct {
	found  string // where it was found
	handle string // /proc/self/fd/N, the open file
}

// findProgram finds name on PATH (or takes it as given when absolute)
// and opens it; nil for a name relative to the working folder, or one
// not found yet (a program a volume brings is found after the mounts).
// The handle is not closed on exec: a script's interpreter opens the
// script by it.
func findProgram(name string) (*foundProgram, error) {
	if strings.Contains(name, "/") && !filepath.IsAbs(name) {
		return nil, nil
	}
	found, err := exec.LookPath(name)
	if err != nil {
		return nil, nil
	}
	fd, err := unix.Open(found, unix.O_PATH, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", found, err)
	}
	return &foundProgram{found: found, handle: fmt.Sprintf("/proc/self/fd/%d", fd)}, nil
}

// path is what to exec: the path found, when the mounts left it naming
// the same file (so the process sees its usual argv[0] and /proc/PID/exe),
// else the open handle.
func (p *foundProgram) path() string {
	now, errNow := os.Stat(p.found)
	then, errThen := os.Stat(p.handle)
	if errNow == nil && errThen == nil && os.SameFile(now, then) {
		return p.found
	}
	return p.handle
}

// openPath opens path (a file or a folder, following symlinks) without
// reading it, and returns the name under /proc/self/fd that stands for the
// opened object whatever is mounted over its path later. The descriptor
// stays open until the exec, which closes it.
func openPath(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd), nil
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

type shadowFS struct {
	// scratch is the opened scratch folder (see openPath).
	scratch  string
	n        int
	shadowed map[string]bool
}

// mountpoint returns where to mount for target, making it (a directory, or
// an empty file) if it does not exist. Symlinks on the way are followed.
func (fs *shadowFS) mountpoint(target string, dir bool) (string, error) {
	parts := strings.Split(strings.Trim(filepath.Clean(target), "/"), "/")
	cur := "/"
	for i, p := range parts {
		if p == "" {
			continue
		}
		next := filepath.Join(cur, p)
		if _, err := os.Lstat(next); err == nil {
			real, err := filepath.EvalSymlinks(next)
			if err != nil {
				return "", err
			}
			cur = real
			continue
		}
		if !fs.shadowed[cur] {
			if err := fs.shadow(cur); err != nil {
				return "", fmt.Errorf("shadowing %s: %w", cur, err)
			}
		}
		// Everything from here on is new, on the shadow's tmpfs.
		made := filepath.Join(append([]string{cur}, parts[i:]...)...)
		parent := made
		if !dir {
			parent = filepath.Dir(made)
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return "", err
		}
		// New folders are on the tmpfs already: more can be made in them.
		for d := parent; strings.HasPrefix(d, cur) && d != cur; d = filepath.Dir(d) {
			fs.shadowed[d] = true
		}
		if !dir {
			f, err := os.OpenFile(made, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return "", err
			}
			f.Close()
		}
		return made, nil
	}
	return cur, nil
}

// shadow puts a tmpfs over dir that holds the same entries (bind mounts of
// the originals, symlinks copied), so new entries can be made in it while
// the existing ones stay the machine's.
func (fs *shadowFS) shadow(dir string) error {
	fs.n++
	s := filepath.Join(fs.scratch, fmt.Sprintf("shadow-%d", fs.n))
	if err := os.MkdirAll(s, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", s, "tmpfs", 0, "mode=755"); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		src, dst := filepath.Join(dir, e.Name()), filepath.Join(s, e.Name())
		info, err := os.Lstat(src)
		if err != nil {
			continue // gone meanwhile
		}
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			link, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, dst); err != nil {
				return err
			}
			continue
		case info.IsDir():
			if err := os.Mkdir(dst, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			f.Close()
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", src, err)
		}
	}
	if dir == "/" {
		// The root itself: move the shadow there and enter it, as
		// switch_root does.
		if err := os.Chdir(s); err != nil {
			return err
		}
		if err := unix.Mount(s, "/", "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("moving the shadow to /: %w", err)
		}
		if err := unix.Chroot("."); err != nil {
			return err
		}
		if err := os.Chdir("/"); err != nil {
			return err
		}
	} else if err := unix.Mount(s, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	fs.shadowed[dir] = true
	return nil
}
