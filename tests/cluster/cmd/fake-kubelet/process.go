package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Process pods: a pod whose images are all in the image map runs its
// containers as processes on this machine, in a network namespace of its
// own, with the lifecycle a kubelet gives them: init containers in order,
// probes, restarts with the crash back-off, termination messages, preStop
// and graceful termination. One podWorker goroutine owns each such pod; the
// goroutines it starts (process waits, probes, preStop) only send it
// events, so all state changes happen in one place.

const (
	// The kubelet's termination message from logs: at most 80 lines, 2 KiB.
	terminationLogLines = 80
	terminationLogBytes = 2048
	initialRestartDelay = 10 * time.Second
	// After a kill at the end of the grace period a process gets this long
	// to go before the pod is removed anyway.
	minimumGrace = 2 * time.Second
	// A process pod's container ID; its prefix tells, after a restart of
	// this kubelet, that a pod was run as processes.
	processIDPrefix = "process://"
)

type procContainer struct {
	spec   v1.Container
	img    imageConfig
	isInit bool

	gen       int // incremented at each start; events of older starts are dropped
	proc      *os.Process
	running   bool
	startedAt time.Time
	env       []string

	restarts  int32
	last      *v1.ContainerStateTerminated
	term      *v1.ContainerStateTerminated // finished for good (or an init container that completed)
	waiting   *v1.ContainerStateWaiting
	restartAt time.Time
	crashes   int // consecutive, for the back-off
	started   bool
	ready     bool
	killAt    time.Time // SIGKILL if still running then
	stopProbe context.CancelFunc
}

type exitEvent struct {
	name string
	gen  int
	code int32
	at   time.Time
}

type probeEvent struct {
	name string
	gen  int
	kind string // Startup, Readiness, Liveness
	ok   bool
	msg  string
}

type termSentEvent struct {
	name string
	gen  int
}

type podWorker struct {
	k       *kubelet
	uid     types.UID
	pod     *v1.Pod
	updates chan *v1.Pod
	events  chan any
	cancel  context.CancelFunc
	done    chan struct{}

	ip, netns string
	dir       string
	volumes   map[string]string // volume name → its folder
	ctrs      []*procContainer  // init containers first
	forwards  context.CancelFunc
	setupErr  string
	setupAt   time.Time
	deleting  bool
	deadline  time.Time
	finished  bool
	retryAt   time.Time // of a status write or the final delete
}

func (k *kubelet) startWorker(pod *v1.Pod, imgs map[string]imageConfig, recovered bool) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &podWorker{
		k: k, uid: pod.UID, pod: pod,
		updates: make(chan *v1.Pod, 1),
		events:  make(chan any, 64),
		cancel:  cancel,
		done:    make(chan struct{}),
		dir:     filepath.Join(k.rootDir, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
	}
	for i, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			pc := &procContainer{spec: c, img: imgs[c.Name], isInit: i == 0}
			if recovered {
				// This kubelet restarted, and the processes went with it:
				// they start again, as after a node reboot.
				for _, old := range append(append([]v1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
					if old.Name == c.Name {
						pc.restarts = old.RestartCount + 1
						if old.State.Terminated != nil && pc.isInit && old.State.Terminated.ExitCode == 0 {
							pc.term = old.State.Terminated
						}
					}
				}
			}
			w.ctrs = append(w.ctrs, pc)
		}
	}
	k.mu.Lock()
	k.workers[pod.UID] = w
	k.mu.Unlock()
	klog.InfoS("starting process pod", "pod", klog.KObj(pod), "recovered", recovered)
	go w.run(ctx)
}

func (k *kubelet) workerFor(uid types.UID) *podWorker {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.workers[uid]
}

// update hands the worker the newest pod; an older one still queued is
// replaced.
func (w *podWorker) update(pod *v1.Pod) {
	for {
		select {
		case w.updates <- pod:
			return
		default:
		}
		select {
		case <-w.updates:
		default:
		}
	}
}

func (w *podWorker) send(ev any) {
	select {
	case w.events <- ev:
	case <-w.done:
	}
}

func (w *podWorker) run(ctx context.Context) {
	defer func() {
		w.k.mu.Lock()
		if w.k.workers[w.uid] == w {
			delete(w.k.workers, w.uid)
		}
		w.k.mu.Unlock()
		close(w.done)
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.step(ctx)
		if w.finished {
			return
		}
		w.report(ctx)
		timer.Reset(w.nextWake())
		select {
		case p := <-w.updates:
			w.pod = p
			if p.DeletionTimestamp != nil && !w.deleting {
				w.beginDeletion()
			}
		case ev := <-w.events:
			w.handle(ev)
		case <-timer.C:
		case <-ctx.Done():
			w.shutdown()
			return
		}
	}
}

func (w *podWorker) nextWake() time.Duration {
	next := time.Now().Add(time.Minute)
	consider := func(t time.Time) {
		if !t.IsZero() && t.Before(next) {
			next = t
		}
	}
	consider(w.retryAt)
	consider(w.setupAt)
	for _, c := range w.ctrs {
		if c.running {
			consider(c.killAt)
		} else if c.term == nil {
			consider(c.restartAt)
		}
	}
	d := time.Until(next)
	if d < 10*time.Millisecond {
		d = 10 * time.Millisecond
	}
	return d
}

// setup gives the pod its address, network namespace and host ports.
func (w *podWorker) setup(ctx context.Context) error {
	if w.netns != "" {
		return nil
	}
	if w.ip == "" {
		ip, err := w.k.podIPs(w.pod)
		if err != nil {
			return err
		}
		w.ip = ip
	}
	if err := w.prepareVolumes(ctx); err != nil {
		return err
	}
	forwards, err := w.k.nodeForwardPorts(ctx)
	if err != nil {
		return err
	}
	ns, err := w.k.net.addPod(w.ip)
	if err != nil {
		return err
	}
	if err := w.k.net.forwardNodePorts(forwards); err != nil {
		w.k.net.removePod(ns)
		return err
	}
	// The `kubernetes` Service's port: clients that find the API server
	// by its name (Kopf's service-account login asks for
	// https://kubernetes.default.svc) reach it at 443 of the address the
	// pod's hosts file gives that name.
	if w.k.apiPort != 0 {
		if err := w.k.net.forwardNodePort(apiServicePort, w.k.apiPort); err != nil {
			w.k.net.removePod(ns)
			return err
		}
	}
	fctx, cancel := context.WithCancel(ctx)
	for _, c := range w.ctrs {
		for _, p := range c.spec.Ports {
			if p.HostPort == 0 || (p.Protocol != "" && p.Protocol != v1.ProtocolTCP) {
				continue
			}
			listen := fmt.Sprintf("%s:%d", hostIP, p.HostPort)
			target := fmt.Sprintf("%s:%d", w.ip, p.ContainerPort)
			if err := w.k.net.forward(fctx, listen, target); err != nil {
				cancel()
				w.k.net.removePod(ns)
				return fmt.Errorf("hostPort %d of container %s: %w", p.HostPort, c.spec.Name, err)
			}
		}
	}
	w.netns, w.forwards = ns, cancel
	return nil
}

// step starts what is due: init containers one at a time, then every
// regular container; during deletion it kills what outlived its grace
// period and finishes the pod once nothing runs.
func (w *podWorker) step(ctx context.Context) {
	now := time.Now()
	for _, c := range w.ctrs {
		if c.running && !c.killAt.IsZero() && !now.Before(c.killAt) {
			klog.InfoS("killing container after its grace period", "pod", klog.KObj(w.pod), "container", c.spec.Name)
			_ = syscall.Kill(-c.proc.Pid, syscall.SIGKILL)
			c.killAt = now.Add(time.Hour) // once
		}
	}
	if w.deleting {
		for _, c := range w.ctrs {
			if c.running {
				return
			}
		}
		w.finishDeletion()
		return
	}
	if w.netns == "" {
		if now.Before(w.setupAt) {
			return
		}
		if err := w.setup(ctx); err != nil {
			w.setupErr = err.Error()
			w.setupAt = now.Add(2 * time.Second)
			var cfgErr *configError
			if errors.As(err, &cfgErr) {
				w.k.recorder.Eventf(w.pod, v1.EventTypeWarning, "FailedMount", "MountVolume.SetUp failed: %v", err)
			} else {
				w.k.recorder.Eventf(w.pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
			}
			return
		}
		w.setupErr, w.setupAt = "", time.Time{}
	}
	for _, c := range w.ctrs {
		if !c.isInit {
			break
		}
		if c.term != nil && c.term.ExitCode == 0 {
			continue
		}
		if !c.running && c.term == nil && !now.Before(c.restartAt) {
			w.start(ctx, c)
		}
		return // the next init container waits for this one
	}
	for _, c := range w.ctrs {
		if !c.isInit && !c.running && c.term == nil && !now.Before(c.restartAt) {
			w.start(ctx, c)
		}
	}
}

func (w *podWorker) initDone() bool {
	for _, c := range w.ctrs {
		if c.isInit && (c.term == nil || c.term.ExitCode != 0) {
			return false
		}
	}
	return true
}

func (w *podWorker) start(ctx context.Context, c *procContainer) {
	pod := w.pod
	fail := func(reason, msg string) {
		c.waiting = &v1.ContainerStateWaiting{Reason: reason, Message: msg}
		c.restartAt = time.Now().Add(2 * time.Second)
		w.k.recorder.Eventf(pod, v1.EventTypeWarning, "Failed", "Error: %s", msg)
	}
	env, own, err := containerEnv(w.k.newRefs(ctx, pod.Namespace), pod, w.ip, &c.spec, c.img)
	if err != nil {
		var cfgErr *configError
		if errors.As(err, &cfgErr) {
			fail("CreateContainerConfigError", err.Error())
		} else {
			c.restartAt = time.Now().Add(time.Second) // the API did not answer; retry
		}
		return
	}
	args := argv(&c.spec, c.img, own)
	if len(args) == 0 {
		fail("CreateContainerError", "no command specified")
		return
	}
	mounts, err := w.mountsOf(&c.spec, own)
	if err != nil {
		fail("CreateContainerConfigError", err.Error())
		return
	}
	mounts = append(imageFiles(c.img), mounts...)
	logDir := filepath.Join(w.dir, c.spec.Name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fail("CreateContainerError", err.Error())
		return
	}
	if c.gen > 0 || c.last != nil {
		c.restarts++
	}
	logPath := filepath.Join(logDir, fmt.Sprintf("%d.log", c.restarts))
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fail("CreateContainerError", err.Error())
		return
	}
	dir := c.spec.WorkingDir
	if dir == "" {
		dir = c.img.WorkingDir
	}
	if dir == "" {
		dir = "/"
	}
	spec, err := json.Marshal(initSpec{
		Mounts:  mounts,
		Scratch: filepath.Join(logDir, fmt.Sprintf("scratch-%d", c.restarts)),
		Dir:     dir,
		Argv:    args,
	})
	specPath := filepath.Join(logDir, fmt.Sprintf("init-%d.json", c.restarts))
	if err == nil {
		err = os.WriteFile(specPath, spec, 0o644)
	}
	if err != nil {
		logFile.Close()
		fail("CreateContainerError", err.Error())
		return
	}
	line := execIn(w.netns, []string{w.k.selfExe, "container-init", specPath})
	cmd := exec.Command(line[0], line[1:]...)
	cmd.Env, cmd.Dir = env, "/"
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so a signal reaches everything it started;
	// and it dies with this kubelet, as containers do with their node.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		fail("RunContainerError", err.Error())
		return
	}
	logFile.Close()
	c.gen++
	c.proc, c.running, c.env = cmd.Process, true, env
	c.startedAt = time.Now()
	c.waiting, c.killAt = nil, time.Time{}
	c.started = c.spec.StartupProbe == nil
	c.ready = false
	gen, name := c.gen, c.spec.Name
	klog.InfoS("container started", "pod", klog.KObj(pod), "container", name, "pid", cmd.Process.Pid, "restarts", c.restarts, "log", logPath)
	w.k.recorder.Eventf(pod, v1.EventTypeNormal, "Started", "Started container %s", name)
	go func() {
		err := cmd.Wait()
		code := int32(0)
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int32(ws.Signal())
			} else {
				code = int32(exitErr.ExitCode())
			}
		} else if err != nil {
			code = 128
		}
		w.send(exitEvent{name: name, gen: gen, code: code, at: time.Now()})
	}()
	pctx, cancel := context.WithCancel(ctx)
	c.stopProbe = cancel
	if !c.isInit {
		go w.probeContainer(pctx, c.spec, gen, cmd.Process.Pid, env)
	}
}

func (w *podWorker) container(name string, gen int) *procContainer {
	for _, c := range w.ctrs {
		if c.spec.Name == name && c.gen == gen {
			return c
		}
	}
	return nil
}

func (w *podWorker) handle(ev any) {
	switch ev := ev.(type) {
	case exitEvent:
		c := w.container(ev.name, ev.gen)
		if c == nil || !c.running {
			return
		}
		w.exited(c, ev)
	case probeEvent:
		c := w.container(ev.name, ev.gen)
		if c == nil || !c.running {
			return
		}
		switch {
		case ev.kind == "Startup" && ev.ok:
			c.started = true
		case ev.kind == "Readiness":
			c.ready = ev.ok
		case !ev.ok && !w.deleting: // a failed startup or liveness probe
			w.k.recorder.Eventf(w.pod, v1.EventTypeNormal, "Killing", "Container %s failed %s probe, will be restarted", c.spec.Name, strings.ToLower(ev.kind))
			grace := w.graceOf(c.spec.LivenessProbe)
			if ev.kind == "Startup" {
				grace = w.graceOf(c.spec.StartupProbe)
			}
			_ = syscall.Kill(-c.proc.Pid, syscall.SIGTERM)
			c.killAt = time.Now().Add(grace)
		}
	case termSentEvent:
		if c := w.container(ev.name, ev.gen); c != nil && c.running {
			c.killAt = w.deadline
			if until := time.Now().Add(minimumGrace); c.killAt.Before(until) {
				c.killAt = until
			}
		}
	}
}

// graceOf is the time between SIGTERM and SIGKILL for a probe's kill.
func (w *podWorker) graceOf(p *v1.Probe) time.Duration {
	if p != nil && p.TerminationGracePeriodSeconds != nil {
		return time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
	}
	if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

func (w *podWorker) exited(c *procContainer, ev exitEvent) {
	c.running, c.ready, c.started = false, false, false
	if c.stopProbe != nil {
		c.stopProbe()
	}
	state := &v1.ContainerStateTerminated{
		ExitCode:    ev.code,
		Reason:      "Completed",
		StartedAt:   metav1.NewTime(c.startedAt.Truncate(time.Second)),
		FinishedAt:  metav1.NewTime(ev.at.Truncate(time.Second)),
		ContainerID: fmt.Sprintf("%s%d", processIDPrefix, c.proc.Pid),
	}
	if ev.code != 0 {
		state.Reason = "Error"
		if c.spec.TerminationMessagePolicy == v1.TerminationMessageFallbackToLogsOnError {
			state.Message = logTail(filepath.Join(w.dir, c.spec.Name, fmt.Sprintf("%d.log", c.restarts)))
		}
	}
	klog.InfoS("container exited", "pod", klog.KObj(w.pod), "container", c.spec.Name, "code", ev.code)
	policy := w.pod.Spec.RestartPolicy
	if c.spec.RestartPolicy != nil && c.isInit {
		policy = v1.RestartPolicy(*c.spec.RestartPolicy)
	}
	restart := !w.deleting && (policy == v1.RestartPolicyAlways || policy == "" || (policy == v1.RestartPolicyOnFailure && ev.code != 0))
	if c.isInit && ev.code == 0 {
		restart = false
	}
	if !restart {
		c.term = state
		return
	}
	c.last = state
	if ev.at.Sub(c.startedAt) >= 2*w.k.maxRestartDelay {
		c.crashes = 0 // it ran long enough: the back-off starts over
	}
	delay := restartDelay(c.crashes, w.k.maxRestartDelay)
	c.crashes++
	c.restartAt = ev.at.Add(delay)
	if delay > 0 {
		c.waiting = &v1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", delay, c.spec.Name, w.pod.Name, w.pod.Namespace, w.pod.UID),
		}
		w.k.recorder.Eventf(w.pod, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", c.spec.Name, w.pod.Name, w.pod.Namespace, w.pod.UID)
	}
}

// restartDelay is the kubelet's crash back-off: the first restart is at
// once, then 10 s, doubling up to the maximum.
func restartDelay(crashes int, max time.Duration) time.Duration {
	if crashes == 0 {
		return 0
	}
	d := initialRestartDelay
	if d > max {
		return max
	}
	for i := 1; i < crashes; i++ {
		d *= 2
		if d >= max {
			return max
		}
	}
	return d
}

// logTail is the end of a log as the kubelet cuts it for a termination
// message: the last 80 lines, at most 2 KiB.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return ""
	}
	size := info.Size()
	// Enough bytes that the line limit, not the read, decides.
	start := size - 64*1024
	if start < 0 {
		start = 0
	}
	buf := make([]byte, size-start)
	if _, err := f.ReadAt(buf, start); err != nil {
		return ""
	}
	return tailOf(string(buf))
}

func tailOf(s string) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > terminationLogLines {
		lines = lines[len(lines)-terminationLogLines:]
	}
	out := strings.Join(lines, "\n")
	if len(out) > terminationLogBytes {
		out = out[len(out)-terminationLogBytes:]
	}
	return out
}

// beginDeletion runs each running container's preStop hook, then sends
// it SIGTERM; whatever still runs at the end of the grace period gets
// SIGKILL.
func (w *podWorker) beginDeletion() {
	w.deleting = true
	grace := 30 * time.Second
	if g := w.pod.DeletionGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	} else if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	w.deadline = time.Now().Add(grace)
	klog.InfoS("deleting process pod", "pod", klog.KObj(w.pod), "grace", grace)
	for _, c := range w.ctrs {
		c.restartAt = time.Time{}
		if !c.running {
			continue
		}
		w.k.recorder.Eventf(w.pod, v1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
		c.killAt = w.deadline.Add(minimumGrace) // until SIGTERM is sent
		spec, gen, pid, env := c.spec, c.gen, c.proc.Pid, c.env
		deadline := w.deadline
		go func() {
			if spec.Lifecycle != nil && spec.Lifecycle.PreStop != nil {
				ctx, cancel := context.WithDeadline(context.Background(), deadline)
				if err := w.runHandler(ctx, spec, pid, env, spec.Lifecycle.PreStop); err != nil {
					w.k.recorder.Eventf(w.pod, v1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed: %v", err)
				}
				cancel()
			}
			_ = syscall.Kill(-pid, syscall.SIGTERM)
			w.send(termSentEvent{name: spec.Name, gen: gen})
		}()
	}
}

// finishDeletion removes the pod's network and then the pod itself, as the
// kubelet does once its containers are gone.
func (w *podWorker) finishDeletion() {
	if time.Now().Before(w.retryAt) {
		return
	}
	w.release()
	zero := int64(0)
	uid := w.uid
	// Not the worker's context: the pod's removal from the API (which this
	// request causes) cancels that one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := w.k.client.CoreV1().Pods(w.pod.Namespace).Delete(ctx, w.pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		klog.ErrorS(err, "deleting terminated pod, will retry", "pod", klog.KObj(w.pod))
		w.retryAt = time.Now().Add(time.Second)
		return
	}
	klog.InfoS("pod terminated", "pod", klog.KObj(w.pod))
	w.finished = true
}

func (w *podWorker) release() {
	if w.forwards != nil {
		w.forwards()
		w.forwards = nil
	}
	w.k.net.removePod(w.netns)
	w.netns = ""
}

// shutdown stops the pod's processes when this kubelet stops or the pod
// is gone from the API: SIGTERM, then SIGKILL after a few seconds.
func (w *podWorker) shutdown() {
	deadline := time.After(5 * time.Second)
	for _, c := range w.ctrs {
		if c.running {
			_ = syscall.Kill(-c.proc.Pid, syscall.SIGTERM)
		}
	}
	for {
		running := false
		for _, c := range w.ctrs {
			running = running || c.running
		}
		if !running {
			break
		}
		select {
		case ev := <-w.events:
			if e, ok := ev.(exitEvent); ok {
				if c := w.container(e.name, e.gen); c != nil {
					c.running = false
				}
			}
		case <-deadline:
			for _, c := range w.ctrs {
				if c.running {
					_ = syscall.Kill(-c.proc.Pid, syscall.SIGKILL)
				}
			}
			deadline = time.After(time.Hour)
			// Pdeathsig and the kill take them; the namespace goes now.
			w.release()
			return
		}
	}
	w.release()
}

// report writes the pod's status when it changed.
func (w *podWorker) report(ctx context.Context) {
	if time.Now().Before(w.retryAt) {
		return
	}
	for attempt := 0; attempt < 3; attempt++ {
		current := w.pod
		if cached, err := w.k.pods.Pods(w.pod.Namespace).Get(w.pod.Name); err == nil && cached.UID == w.uid {
			current = cached
		}
		if attempt > 0 {
			fresh, err := w.k.client.CoreV1().Pods(w.pod.Namespace).Get(ctx, w.pod.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			} else if err != nil {
				break
			}
			current = fresh
		}
		status := w.status(current)
		if apiequality.Semantic.DeepEqual(current.Status, status) {
			w.retryAt = time.Time{}
			return
		}
		updated := current.DeepCopy()
		updated.Status = status
		_, err := w.k.client.CoreV1().Pods(current.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
		if err == nil || apierrors.IsNotFound(err) {
			w.retryAt = time.Time{}
			return
		}
		if !apierrors.IsConflict(err) {
			klog.ErrorS(err, "writing pod status, will retry", "pod", klog.KObj(w.pod))
			break
		}
	}
	w.retryAt = time.Now().Add(500 * time.Millisecond)
}

// status is the pod status as the kubelet computes it from its containers.
func (w *podWorker) status(current *v1.Pod) v1.PodStatus {
	s := w.k.baseStatus(current)
	s.Reason, s.Message = "", ""
	if w.ip != "" {
		s.PodIP, s.PodIPs = w.ip, []v1.PodIP{{IP: w.ip}}
	}
	s.InitContainerStatuses, s.ContainerStatuses = nil, nil
	initDone := w.initDone()
	allReady, anyRunning, anyFailed, allDone, anyStarted := true, false, false, true, false
	for _, c := range w.ctrs {
		cs := w.containerStatus(c, initDone)
		if c.isInit {
			s.InitContainerStatuses = append(s.InitContainerStatuses, cs)
			if c.term != nil && c.term.ExitCode != 0 {
				anyFailed = true
			}
			continue
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
		allReady = allReady && cs.Ready
		anyRunning = anyRunning || c.running
		anyStarted = anyStarted || c.gen > 0
		if c.term == nil {
			allDone = false
		} else if c.term.ExitCode != 0 {
			anyFailed = true
		}
	}
	switch {
	case len(w.ctrs) > 0 && anyFailed && (allDone || !initDone) && !anyRunning:
		s.Phase = v1.PodFailed
	case initDone && allDone && len(s.ContainerStatuses) > 0:
		s.Phase = v1.PodSucceeded
	case initDone && anyStarted:
		s.Phase = v1.PodRunning
	default:
		s.Phase = v1.PodPending
	}
	setCondition(&s, v1.PodScheduled, true, "")
	setCondition(&s, v1.PodReadyToStartContainers, w.netns != "", "")
	initReason := ""
	if !initDone {
		initReason = "ContainersNotInitialized"
	}
	setCondition(&s, v1.PodInitialized, initDone, initReason)
	ready, reason := allReady && initDone, ""
	if s.Phase == v1.PodSucceeded || s.Phase == v1.PodFailed {
		ready, reason = false, "PodCompleted"
	} else if !ready {
		reason = "ContainersNotReady"
	}
	setCondition(&s, v1.ContainersReady, ready, reason)
	for _, gate := range current.Spec.ReadinessGates {
		if c := findCondition(s.Conditions, gate.ConditionType); (c == nil || c.Status != v1.ConditionTrue) && ready {
			ready, reason = false, "ReadinessGatesNotReady"
		}
	}
	setCondition(&s, v1.PodReady, ready, reason)
	return s
}

func (w *podWorker) containerStatus(c *procContainer, initDone bool) v1.ContainerStatus {
	cs := v1.ContainerStatus{
		Name:         c.spec.Name,
		Image:        c.spec.Image,
		ImageID:      imageID(c.spec.Image),
		RestartCount: c.restarts,
		Ready:        c.running && c.started && (c.ready || c.spec.ReadinessProbe == nil) && !c.isInit,
		Started:      ptr(c.running && c.started),
		LastTerminationState: func() v1.ContainerState {
			if c.last == nil {
				return v1.ContainerState{}
			}
			return v1.ContainerState{Terminated: c.last}
		}(),
	}
	if c.isInit && c.term != nil && c.term.ExitCode == 0 {
		cs.Ready = true
	}
	switch {
	case c.running:
		cs.ContainerID = fmt.Sprintf("%s%d", processIDPrefix, c.proc.Pid)
		cs.State.Running = &v1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt.Truncate(time.Second))}
	case c.term != nil:
		cs.ContainerID = c.term.ContainerID
		cs.State.Terminated = c.term
	case c.waiting != nil:
		cs.State.Waiting = c.waiting
	case !c.isInit && !initDone:
		cs.State.Waiting = &v1.ContainerStateWaiting{Reason: "PodInitializing"}
	case w.setupErr != "":
		cs.State.Waiting = &v1.ContainerStateWaiting{Reason: "ContainerCreating", Message: w.setupErr}
	default:
		cs.State.Waiting = &v1.ContainerStateWaiting{Reason: "ContainerCreating"}
	}
	if cs.ContainerID == "" && c.last != nil {
		cs.ContainerID = c.last.ContainerID
	}
	return cs
}

// ranAsProcesses tells whether this kubelet ran the pod as processes before
// it restarted.
func ranAsProcesses(pod *v1.Pod) bool {
	for _, cs := range append(append([]v1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if strings.HasPrefix(cs.ContainerID, processIDPrefix) {
			return true
		}
		for _, st := range []*v1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if st != nil && strings.HasPrefix(st.ContainerID, processIDPrefix) {
				return true
			}
		}
	}
	return false
}
