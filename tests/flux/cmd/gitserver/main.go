// Command gitserver serves a folder of bare Git repositories over smart
// HTTP on loopback, for the Flux tests: source-controller clones from it,
// and the tests push to it (libgit2 or git), without authentication.
//
// It is Flux's own test Git server (github.com/fluxcd/gitkit, the handler
// github.com/fluxcd/pkg/gittestserver wraps) on a listener of our choosing,
// so that the address stays the same across restarts. gitkit runs the
// machine's `git upload-pack` and `git receive-pack` for each request.
//
//	gitserver -root DIR [-listen 127.0.0.1:PORT] [-url-file FILE] [-no-auto-create]
//
// A push to a repository that does not exist creates it (a bare
// repository whose HEAD is -default-branch, main by default) unless
// -no-auto-create is given; a fetch of one is a 404. Once listening it prints its base URL (http://127.0.0.1:PORT/)
// on stdout, and to -url-file when set; a repository DIR/NAME.git is then
// at BASE/NAME.git. It stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fluxcd/gitkit"
)

func main() {
	root := flag.String("root", "", "folder of bare repositories (created if missing)")
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (port 0: any free port)")
	urlFile := flag.String("url-file", "", "also write the base URL to this file, once listening")
	noAutoCreate := flag.Bool("no-auto-create", false, "refuse pushes to repositories that do not exist")
	defaultBranch := flag.String("default-branch", "main", "HEAD of the repositories a push creates")
	gitPath := flag.String("git", "git", "the git binary")
	flag.Parse()
	if *root == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: gitserver -root DIR [-listen 127.0.0.1:PORT] [-url-file FILE] [-no-auto-create]")
		os.Exit(2)
	}
	dir, err := filepath.Abs(*root)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	git, err := exec.LookPath(*gitPath)
	if err != nil {
		log.Fatalf("gitserver runs git for each request: %v", err)
	}

	service := gitkit.New(gitkit.Config{Dir: dir, GitPath: git})
	if err := service.Setup(); err != nil {
		log.Fatal(err)
	}
	var handler http.Handler = service
	if !*noAutoCreate {
		handler = createOnPush(service, dir, git, *defaultBranch)
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	base := "http://" + ln.Addr().String() + "/"
	if *urlFile != "" {
		tmp := *urlFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(base+"\n"), 0o644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(tmp, *urlFile); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(base)
	log.Printf("serving the repositories under %s at %s", dir, base)

	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// createOnPush makes the bare repository a push names when it does not
// exist yet, its HEAD on branch (whatever init.defaultBranch says on this
// machine), so that a clone without a branch checks that branch out. Only a
// push creates: a fetch of a missing repository is a 404.
func createOnPush(next http.Handler, root, git, branch string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, push := pushTarget(r)
		if push {
			if name == "" || strings.Contains(name, "..") {
				http.Error(w, "Forbidden", http.StatusForbidden)
				return
			}
			repo := filepath.Join(root, filepath.FromSlash(name))
			if _, err := os.Stat(filepath.Join(repo, "objects")); err != nil {
				out, err := exec.Command(git, "init", "--quiet", "--bare", "--initial-branch="+branch, repo).CombinedOutput()
				if err != nil {
					log.Printf("creating %s: %v: %s", repo, err, out)
					http.Error(w, "Internal server error", http.StatusInternalServerError)
					return
				}
				log.Printf("created %s (HEAD %s)", repo, branch)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// pushTarget: the repository (a path under the root) of a push request.
func pushTarget(r *http.Request) (string, bool) {
	p := r.URL.Path
	switch {
	case r.Method == http.MethodGet && strings.HasSuffix(p, "/info/refs") &&
		r.URL.Query().Get("service") == "git-receive-pack":
		p = strings.TrimSuffix(p, "/info/refs")
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/git-receive-pack"):
		p = strings.TrimSuffix(p, "/git-receive-pack")
	default:
		return "", false
	}
	return strings.Trim(p, "/"), true
}
