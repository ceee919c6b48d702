package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/component-base/version"
)

// Probes and lifecycle handlers of process containers, run the way the
// kubelet runs them: httpGet and tcpSocket from the node (here: from the
// node's network namespace) to the pod's address, exec inside the pod's
// namespace with the container's environment.

// probeContainer runs the startup probe until it passes, then the
// readiness and liveness probes, each reporting only when its result
// changes (or, for liveness, when it fails for good).
func (w *podWorker) probeContainer(ctx context.Context, c v1.Container, gen, pid int, env []string) {
	if c.StartupProbe != nil {
		if !w.probeLoop(ctx, c, gen, pid, env, "Startup", c.StartupProbe) {
			return
		}
		w.send(probeEvent{name: c.Name, gen: gen, kind: "Startup", ok: true})
	}
	if c.ReadinessProbe != nil {
		go w.probeLoop(ctx, c, gen, pid, env, "Readiness", c.ReadinessProbe)
	}
	if c.LivenessProbe != nil {
		go w.probeLoop(ctx, c, gen, pid, env, "Liveness", c.LivenessProbe)
	}
}

// probeLoop returns true when a startup probe passed; false when the
// context ended or a startup or liveness probe failed for good.
func (w *podWorker) probeLoop(ctx context.Context, c v1.Container, gen, pid int, env []string, kind string, p *v1.Probe) bool {
	period := seconds(p.PeriodSeconds, 10)
	timeout := seconds(p.TimeoutSeconds, 1)
	successThreshold, failureThreshold := orDefault(p.SuccessThreshold, 1), orDefault(p.FailureThreshold, 3)
	if !sleepCtx(ctx, time.Duration(p.InitialDelaySeconds)*time.Second) {
		return false
	}
	successes, failures := int32(0), int32(0)
	reported := "" // "ok" or "fail", for readiness
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := w.probeOnce(pctx, c, pid, env, p.ProbeHandler)
		cancel()
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			successes, failures = successes+1, 0
		} else {
			successes, failures = 0, failures+1
			w.k.recorder.Eventf(w.pod, v1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
		}
		switch kind {
		case "Startup":
			if err == nil {
				return true
			}
			if failures >= failureThreshold {
				w.send(probeEvent{name: c.Name, gen: gen, kind: kind, ok: false, msg: err.Error()})
				return false
			}
		case "Liveness":
			if failures >= failureThreshold {
				w.send(probeEvent{name: c.Name, gen: gen, kind: kind, ok: false, msg: err.Error()})
				return false
			}
		case "Readiness":
			if err == nil && successes >= successThreshold && reported != "ok" {
				reported = "ok"
				w.send(probeEvent{name: c.Name, gen: gen, kind: kind, ok: true})
			} else if err != nil && failures >= failureThreshold && reported != "fail" {
				reported = "fail"
				w.send(probeEvent{name: c.Name, gen: gen, kind: kind, ok: false, msg: err.Error()})
			}
		}
		if !sleepCtx(ctx, period) {
			return false
		}
	}
}

func seconds(v int32, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

func orDefault(v, def int32) int32 {
	if v <= 0 {
		return def
	}
	return v
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (w *podWorker) probeOnce(ctx context.Context, c v1.Container, pid int, env []string, h v1.ProbeHandler) error {
	switch {
	case h.HTTPGet != nil:
		return w.httpGet(ctx, c, h.HTTPGet)
	case h.TCPSocket != nil:
		port, err := portOf(c, h.TCPSocket.Port)
		if err != nil {
			return err
		}
		host := h.TCPSocket.Host
		if host == "" {
			host = w.ip
		}
		conn, err := w.k.net.dial(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case h.Exec != nil:
		return execInContainer(ctx, pid, env, h.Exec.Command)
	case h.GRPC != nil:
		return errors.New("grpc probes are not supported by this kubelet")
	}
	return errors.New("probe has no handler")
}

// runHandler runs a lifecycle hook (preStop) to completion or ctx's end.
func (w *podWorker) runHandler(ctx context.Context, c v1.Container, pid int, env []string, h *v1.LifecycleHandler) error {
	switch {
	case h.Exec != nil:
		return execInContainer(ctx, pid, env, h.Exec.Command)
	case h.HTTPGet != nil:
		return w.httpGet(ctx, c, h.HTTPGet)
	case h.Sleep != nil:
		if !sleepCtx(ctx, time.Duration(h.Sleep.Seconds)*time.Second) {
			return ctx.Err()
		}
		return nil
	case h.TCPSocket != nil:
		return errors.New("tcpSocket lifecycle handlers are deprecated and not run")
	}
	return nil
}

// execInContainer runs a command where the container's process runs: its
// network and mount namespaces, root and working directory.
func execInContainer(ctx context.Context, pid int, env []string, command []string) error {
	if len(command) == 0 {
		return errors.New("exec: no command")
	}
	line := append([]string{"nsenter", "--target", strconv.Itoa(pid), "--mount", "--net", "--root", "--wd", "--"}, command...)
	cmd := exec.CommandContext(ctx, line[0], line[1:]...)
	cmd.Env = env
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return fmt.Errorf("command %q timed out", command)
	}
	if err != nil {
		if len(out) > 0 {
			return fmt.Errorf("command %q: %v: %s", command, err, tailOf(string(out)))
		}
		return fmt.Errorf("command %q: %v", command, err)
	}
	return nil
}

func (w *podWorker) httpGet(ctx context.Context, c v1.Container, g *v1.HTTPGetAction) error {
	port, err := portOf(c, g.Port)
	if err != nil {
		return err
	}
	host := g.Host
	if host == "" {
		host = w.ip
	}
	scheme := "http"
	if g.Scheme == v1.URISchemeHTTPS {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: g.Path}
	if parsed, err := url.Parse(g.Path); err == nil {
		u.Path, u.RawQuery = parsed.Path, parsed.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/"+version.Get().GitVersion)
	req.Header.Set("Accept", "*/*")
	for _, h := range g.HTTPHeaders {
		if http.CanonicalHeaderKey(h.Name) == "Host" {
			req.Host = h.Value
		} else {
			req.Header.Add(h.Name, h.Value)
		}
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext:       w.k.net.dial,
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as the kubelet's probes
	}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 10*1024))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d: %s", resp.StatusCode, tailOf(string(body)))
	}
	return nil
}

// portOf resolves a port number or a named port of the container.
func portOf(c v1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, p.StrVal)
}
