// Command fake-kubelet stands in for both the scheduler and the kubelet of
// the end-to-end test cluster. It
//
//   - registers one Node that is Ready and keeps its status and Lease fresh;
//   - binds every unscheduled pod to that Node;
//   - runs a pod whose images are all in the image map as processes on this
//     machine, each pod in a network namespace of its own (process.go);
//   - simulates every other pod: reports it Running, with container
//     statuses and a pod IP, and Ready unless the pod's model version is
//     listed as unready (see below); finishes it off at once on deletion.
//
// Unready models: the ConfigMap kube-system/fake-kubelet, key "unready",
// holds one model version per line (blank lines and lines starting with #
// are ignored). A pod whose containers set OPENMED_SERVICE_PRELOAD_MODELS
// (as a literal value, through valueFrom.configMapKeyRef, or through
// envFrom.configMapRef) to one of those versions, or to a comma-separated
// list containing one, is Running but never Ready, as if its model failed
// to warm up. The decision is taken once per pod, when it is first seen
// on the Node, so editing the ConfigMap affects only pods created later.
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
)

const (
	modelEnv       = "OPENMED_SERVICE_PRELOAD_MODELS"
	unreadyKey     = "unready"
	heartbeatEvery = 10 * time.Second
	leaseSeconds   = 40
	hostIP         = "127.0.0.1"
	workers        = 4
)

type options struct {
	kubeconfig string
	nodeName   string
	podCIDR    string
	unreadyCM  string
	imagesCM   string
	nodeCM     string
	rootDir    string

	netnsPrefix     string
	maxRestartDelay time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "container-init" {
		containerInit(os.Args[2:]) // does not return
	}
	var o options
	klog.InitFlags(nil)
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of an identity allowed to manage nodes and pods (required)")
	flag.StringVar(&o.nodeName, "node-name", "fake-node", "name of the Node to register")
	flag.StringVar(&o.podCIDR, "pod-cidr", "10.244.0.0/16", "range pod IPs are taken from (addresses are only reported, nothing listens on them)")
	flag.StringVar(&o.unreadyCM, "unready-configmap", "kube-system/fake-kubelet", "namespace/name of the ConfigMap whose key \"unready\" lists unready model versions")
	flag.StringVar(&o.imagesCM, "images-configmap", "kube-system/fake-kubelet-images", "namespace/name of the ConfigMap whose keys map images to the processes that run them (empty: no process pods)")
	flag.StringVar(&o.nodeCM, "node-configmap", "kube-system/fake-kubelet-node", "namespace/name of the ConfigMap whose keys list ports of this machine that process pods reach at their gateway address")
	flag.StringVar(&o.rootDir, "root-dir", "", "folder for process pods' container logs (pods/NAMESPACE_NAME_UID/CONTAINER/RESTART.log); required for process pods")
	flag.StringVar(&o.netnsPrefix, "netns-prefix", "", "prefix of the network namespaces made for process pods; unique per cluster on this machine (default: fake-kubelet-PID)")
	flag.DurationVar(&o.maxRestartDelay, "max-container-restart-period", 300*time.Second, "longest crash back-off between restarts of a process container (the kubelet's maxContainerRestartPeriod)")
	flag.Parse()
	if o.kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		klog.ErrorS(err, "fake-kubelet failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.InfoS("fake-kubelet stopped")
	klog.Flush()
}

type decision struct {
	ready bool
	model string
}

type kubelet struct {
	client     kubernetes.Interface
	nodeName   string
	podCIDR    string
	cmNS       string
	cmName     string
	pods       corelisters.PodLister
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder
	ipam       *ipam
	mu         sync.Mutex
	decisions  map[types.UID]decision
	kubeletVer string

	imagesNS, imagesName string
	nodeCMNS, nodeCMName string
	rootDir              string
	selfExe              string
	net                  *podNetwork
	maxRestartDelay      time.Duration
	workers              map[types.UID]*podWorker
	// apiPort is the API server's port on this machine: pods reach it at
	// their gateway address, as in-cluster clients (a service account's
	// token, KUBERNETES_SERVICE_HOST) expect to.
	apiPort int
}

func run(ctx context.Context, o options) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "fake-kubelet"
	apiPort, err := serverPort(cfg.Host)
	if err != nil {
		return fmt.Errorf("the API server's address %q: %w", cfg.Host, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cmNS, cmName, ok := strings.Cut(o.unreadyCM, "/")
	if !ok {
		return fmt.Errorf("--unready-configmap must be namespace/name, got %q", o.unreadyCM)
	}
	pool, err := newIPAM(o.podCIDR)
	if err != nil {
		return err
	}
	var imagesNS, imagesName string
	if o.imagesCM != "" {
		if imagesNS, imagesName, ok = strings.Cut(o.imagesCM, "/"); !ok {
			return fmt.Errorf("--images-configmap must be namespace/name, got %q", o.imagesCM)
		}
	}
	nodeNS, nodeCMName, ok := strings.Cut(o.nodeCM, "/")
	if !ok {
		return fmt.Errorf("--node-configmap must be namespace/name, got %q", o.nodeCM)
	}
	if o.netnsPrefix == "" {
		o.netnsPrefix = fmt.Sprintf("fake-kubelet-%d", os.Getpid())
	}
	network, err := newPodNetwork(o.netnsPrefix, o.podCIDR)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// Processes of an earlier run died with it (Pdeathsig); their
	// namespaces may remain.
	if os.Geteuid() == 0 {
		network.removeAll()
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	k := &kubelet{
		client:   client,
		nodeName: o.nodeName,
		podCIDR:  o.podCIDR,
		cmNS:     cmNS,
		cmName:   cmName,
		// Retries (conflicts, a missing ConfigMap) back off to at most 2s.
		queue:      workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 2*time.Second)),
		recorder:   broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: o.nodeName}),
		ipam:       pool,
		decisions:  map[types.UID]decision{},
		kubeletVer: version.Get().GitVersion,

		imagesNS: imagesNS, imagesName: imagesName,
		nodeCMNS: nodeNS, nodeCMName: nodeCMName,
		rootDir:         o.rootDir,
		selfExe:         self,
		net:             network,
		maxRestartDelay: o.maxRestartDelay,
		workers:         map[types.UID]*podWorker{},
		apiPort:         apiPort,
	}
	defer k.queue.ShutDown()

	if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := k.heartbeat(ctx); err != nil {
			klog.ErrorS(err, "registering node, will retry", "node", k.nodeName)
			return false, nil
		}
		return true, nil
	}); err != nil {
		return err
	}
	klog.InfoS("node registered", "node", k.nodeName, "version", k.kubeletVer)
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := k.heartbeat(ctx); err != nil {
			klog.ErrorS(err, "node heartbeat failed", "node", k.nodeName)
		}
	}, heartbeatEvery)

	factory := informers.NewSharedInformerFactory(client, 0)
	podInformer := factory.Core().V1().Pods()
	k.pods = podInformer.Lister()
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    k.enqueue,
		UpdateFunc: func(_, obj interface{}) { k.enqueue(obj) },
		DeleteFunc: k.forget,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if os.Geteuid() == 0 {
		k.forwardNodePortsOnChange(ctx, client)
	}
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("cache for %v did not sync", typ)
		}
	}
	// Reserve the IPs of pods that already run here (after a restart).
	if all, err := k.pods.List(labels.Everything()); err == nil {
		for _, p := range all {
			if p.Spec.NodeName == k.nodeName && p.Status.PodIP != "" && !p.Spec.HostNetwork {
				k.ipam.reserve(p.Status.PodIP, p.UID)
			}
		}
	}
	klog.InfoS("watching pods", "workers", workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	k.queue.ShutDown()
	wg.Wait()
	k.stopWorkers()
	if os.Geteuid() == 0 {
		network.removeAll()
	}
	return nil
}

// forwardNodePortsOnChange makes the node's network, and the ports it
// forwards, as soon as the node ConfigMap lists them and again whenever it
// changes, as a real node's network exists before its first pod: a
// process run in the node's namespace (tests/workload/up runs Envoy
// Gateway there, whose ports are fixed) reaches this machine's services
// before any pod starts. A pod's setup forwards them too, so a failure
// here is logged and retried at the next change or pod.
func (k *kubelet) forwardNodePortsOnChange(ctx context.Context, client kubernetes.Interface) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(k.nodeCMNS),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.nodeCMName).String()
		}))
	forward := func(interface{}) {
		ports, err := k.nodeForwardPorts(ctx)
		if err == nil {
			err = k.net.forwardNodePorts(ports)
		}
		if err != nil {
			klog.ErrorS(err, "forwarding the node's ports to pods; retried with the next change or pod")
		}
	}
	if _, err := factory.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    forward,
		UpdateFunc: func(_, obj interface{}) { forward(obj) },
	}); err != nil {
		klog.ErrorS(err, "watching the node ConfigMap")
		return
	}
	factory.Start(ctx.Done())
}

// stopWorkers stops every process pod's processes (as a node going down).
func (k *kubelet) stopWorkers() {
	k.mu.Lock()
	var all []*podWorker
	for _, w := range k.workers {
		all = append(all, w)
	}
	k.mu.Unlock()
	for _, w := range all {
		w.cancel()
	}
	for _, w := range all {
		<-w.done
	}
}

func (k *kubelet) enqueue(obj interface{}) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		k.queue.Add(key)
	}
}

func (k *kubelet) forget(obj interface{}) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	k.mu.Lock()
	delete(k.decisions, pod.UID)
	w := k.workers[pod.UID]
	k.mu.Unlock()
	if w != nil {
		// Removed from the API while it ran (a forced delete): stop it.
		w.cancel()
		<-w.done
	}
	k.ipam.release(pod.UID)
	k.queue.Forget(pod.Namespace + "/" + pod.Name)
	klog.V(2).InfoS("pod gone", "pod", klog.KObj(pod))
}

func (k *kubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		if apierrors.IsConflict(err) {
			klog.V(2).InfoS("conflict, retrying", "pod", key)
		} else {
			klog.ErrorS(err, "syncing pod, will retry", "pod", key)
		}
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

func (k *kubelet) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := k.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}

	if w := k.workerFor(pod.UID); w != nil {
		w.update(pod)
		return nil
	}
	switch {
	case pod.DeletionTimestamp != nil:
		return k.finishDeletion(ctx, pod)
	case pod.Spec.NodeName == "":
		return k.bind(ctx, pod)
	case pod.Spec.NodeName != k.nodeName:
		return nil
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return nil
	}

	if ranAsProcesses(pod) {
		imgs, err := k.readImageMap(ctx)
		if err != nil {
			return err
		}
		found, _, _ := imgs.processImages(pod)
		k.startWorker(pod, found, true)
		return nil
	}
	d, known := k.decisionFor(pod)
	if !known {
		imgs, err := k.readImageMap(ctx)
		if err != nil {
			klog.ErrorS(err, "reading the image map")
			return err
		}
		found, process, err := imgs.processImages(pod)
		if err != nil {
			k.recorder.Eventf(pod, v1.EventTypeWarning, "Failed", "Error: %v", err)
			return k.updateStatus(ctx, pod, k.waitingStatusReason(pod, "ErrImageNeverPull", err.Error()))
		}
		if process {
			if k.rootDir == "" {
				return k.updateStatus(ctx, pod, k.waitingStatusReason(pod, "CreateContainerError", "this kubelet runs process pods only with --root-dir"))
			}
			k.startWorker(pod, found, false)
			return nil
		}
		model, err := k.modelOf(ctx, pod)
		if err != nil {
			var cfgErr *configError
			if errors.As(err, &cfgErr) {
				// Like the kubelet: the container cannot be created until
				// the referenced ConfigMap/key exists; retried with backoff.
				if uerr := k.updateStatus(ctx, pod, k.waitingStatus(pod, cfgErr.Error())); uerr != nil {
					return uerr
				}
			}
			return err
		}
		unready, err := k.unreadyModels(ctx)
		if err != nil {
			return err
		}
		d = decision{model: model, ready: !matches(model, unready)}
		k.mu.Lock()
		k.decisions[pod.UID] = d
		k.mu.Unlock()
		if d.ready {
			klog.InfoS("starting pod", "pod", klog.KObj(pod), "model", model)
		} else {
			klog.InfoS("starting pod that will never be ready", "pod", klog.KObj(pod), "model", model)
			k.recorder.Eventf(pod, v1.EventTypeWarning, "Unhealthy",
				"Readiness probe failed: model %q is listed as unready in ConfigMap %s/%s", model, k.cmNS, k.cmName)
		}
	}
	return k.updateStatus(ctx, pod, k.runningStatus(pod, d))
}

// decisionFor returns the readiness decided earlier for this pod. After a
// restart it is recovered from the status this process reported before.
func (k *kubelet) decisionFor(pod *v1.Pod) (decision, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if d, ok := k.decisions[pod.UID]; ok {
		return d, true
	}
	if pod.Status.Phase == v1.PodRunning {
		if c := findCondition(pod.Status.Conditions, v1.ContainersReady); c != nil {
			d := decision{ready: c.Status == v1.ConditionTrue}
			k.decisions[pod.UID] = d
			return d, true
		}
	}
	return decision{}, false
}

func (k *kubelet) finishDeletion(ctx context.Context, pod *v1.Pod) error {
	zero := int64(0)
	uid := pod.UID
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err == nil {
		klog.InfoS("pod terminated", "pod", klog.KObj(pod))
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func (k *kubelet) bind(ctx context.Context, pod *v1.Pod) error {
	err := k.client.CoreV1().Pods(pod.Namespace).Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     v1.ObjectReference{Kind: "Node", Name: k.nodeName},
	}, metav1.CreateOptions{})
	switch {
	case err == nil:
		klog.InfoS("pod bound", "pod", klog.KObj(pod), "node", k.nodeName)
		k.recorder.Eventf(pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, k.nodeName)
		return nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil // gone, or bound meanwhile: the watch brings the new state
	default:
		return err
	}
}

type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

// modelOf returns the value of OPENMED_SERVICE_PRELOAD_MODELS as the pod's
// containers would see it, joined with "," if several containers set it.
func (k *kubelet) modelOf(ctx context.Context, pod *v1.Pod) (string, error) {
	cms := map[string]*v1.ConfigMap{}
	getCM := func(name string) (*v1.ConfigMap, error) {
		if cm, ok := cms[name]; ok {
			return cm, nil
		}
		cm, err := k.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		cms[name] = cm
		return cm, nil
	}
	var models []string
	containers := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range containers {
		value, set := "", false
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef == nil || !strings.HasPrefix(modelEnv, from.Prefix) {
				continue
			}
			cm, err := getCM(from.ConfigMapRef.Name)
			if err != nil {
				return "", err
			}
			if cm == nil {
				if from.ConfigMapRef.Optional == nil || !*from.ConfigMapRef.Optional {
					return "", &configError{fmt.Sprintf("configmap %q not found", from.ConfigMapRef.Name)}
				}
				continue
			}
			if v, ok := cm.Data[strings.TrimPrefix(modelEnv, from.Prefix)]; ok {
				value, set = v, true
			}
		}
		for _, e := range c.Env {
			if e.Name != modelEnv {
				continue
			}
			switch {
			case e.ValueFrom == nil:
				value, set = e.Value, true
			case e.ValueFrom.ConfigMapKeyRef != nil:
				ref := e.ValueFrom.ConfigMapKeyRef
				optional := ref.Optional != nil && *ref.Optional
				cm, err := getCM(ref.Name)
				if err != nil {
					return "", err
				}
				if cm == nil {
					if !optional {
						return "", &configError{fmt.Sprintf("configmap %q not found", ref.Name)}
					}
					continue
				}
				v, ok := cm.Data[ref.Key]
				if !ok && !optional {
					return "", &configError{fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)}
				}
				value, set = v, ok
			}
		}
		if set && value != "" {
			models = append(models, value)
		}
	}
	return strings.Join(models, ","), nil
}

func (k *kubelet) unreadyModels(ctx context.Context) (map[string]bool, error) {
	// A quorum read, not a cache: an edit made just before the pod was
	// created must be seen.
	cm, err := k.client.CoreV1().ConfigMaps(k.cmNS).Get(ctx, k.cmName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, line := range strings.Split(cm.Data[unreadyKey], "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			set[line] = true
		}
	}
	return set, nil
}

func matches(model string, unready map[string]bool) bool {
	if model == "" || len(unready) == 0 {
		return false
	}
	if unready[strings.TrimSpace(model)] {
		return true
	}
	for _, m := range strings.FieldsFunc(model, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		if unready[m] {
			return true
		}
	}
	return false
}

func (k *kubelet) updateStatus(ctx context.Context, pod *v1.Pod, status v1.PodStatus) error {
	if apiequality.Semantic.DeepEqual(pod.Status, status) {
		return nil
	}
	updated := pod.DeepCopy()
	updated.Status = status
	_, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func now() metav1.Time { return metav1.NewTime(time.Now().Truncate(time.Second)) }

func (k *kubelet) podIPs(pod *v1.Pod) (string, error) {
	if pod.Spec.HostNetwork {
		return hostIP, nil
	}
	if pod.Status.PodIP != "" {
		k.ipam.reserve(pod.Status.PodIP, pod.UID)
		return pod.Status.PodIP, nil
	}
	return k.ipam.allocate(pod.UID)
}

func (k *kubelet) baseStatus(pod *v1.Pod) v1.PodStatus {
	s := *pod.Status.DeepCopy()
	s.HostIP = hostIP
	s.HostIPs = []v1.HostIP{{IP: hostIP}}
	if s.StartTime == nil {
		t := now()
		s.StartTime = &t
	}
	return s
}

func (k *kubelet) waitingStatus(pod *v1.Pod, msg string) v1.PodStatus {
	return k.waitingStatusReason(pod, "CreateContainerConfigError", msg)
}

func (k *kubelet) waitingStatusReason(pod *v1.Pod, reason, msg string) v1.PodStatus {
	s := k.baseStatus(pod)
	s.Phase = v1.PodPending
	setCondition(&s, v1.PodScheduled, true, "")
	setCondition(&s, v1.ContainersReady, false, "ContainersNotReady")
	setCondition(&s, v1.PodReady, false, "ContainersNotReady")
	s.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		s.ContainerStatuses = append(s.ContainerStatuses, v1.ContainerStatus{
			Name:  c.Name,
			Image: c.Image,
			State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason, Message: msg}},
		})
	}
	return s
}

func (k *kubelet) runningStatus(pod *v1.Pod, d decision) v1.PodStatus {
	s := k.baseStatus(pod)
	s.Phase = v1.PodRunning
	s.Reason, s.Message = "", ""
	if ip, err := k.podIPs(pod); err == nil {
		s.PodIP = ip
		s.PodIPs = []v1.PodIP{{IP: ip}}
	} else {
		klog.ErrorS(err, "no pod IP", "pod", klog.KObj(pod))
	}

	started := s.StartTime
	s.InitContainerStatuses = containerStatuses(pod, pod.Spec.InitContainers, pod.Status.InitContainerStatuses, true, *started)
	s.ContainerStatuses = containerStatuses(pod, pod.Spec.Containers, pod.Status.ContainerStatuses, d.ready, *started)

	ready := d.ready
	reason := ""
	if !ready {
		reason = "ContainersNotReady"
	}
	setCondition(&s, v1.PodReadyToStartContainers, true, "")
	setCondition(&s, v1.PodInitialized, true, "")
	setCondition(&s, v1.PodScheduled, true, "")
	setCondition(&s, v1.ContainersReady, ready, reason)
	for _, gate := range pod.Spec.ReadinessGates {
		if c := findCondition(s.Conditions, gate.ConditionType); c == nil || c.Status != v1.ConditionTrue {
			ready, reason = false, "ReadinessGatesNotReady"
		}
	}
	setCondition(&s, v1.PodReady, ready, reason)
	return s
}

func containerStatuses(pod *v1.Pod, spec []v1.Container, old []v1.ContainerStatus, ready bool, started metav1.Time) []v1.ContainerStatus {
	var out []v1.ContainerStatus
	for _, c := range spec {
		startedAt := started
		for _, o := range old {
			if o.Name == c.Name && o.State.Running != nil {
				startedAt = o.State.Running.StartedAt
			}
		}
		cs := v1.ContainerStatus{
			Name:        c.Name,
			Image:       c.Image,
			ImageID:     imageID(c.Image),
			ContainerID: fmt.Sprintf("fake://%x", sha256.Sum256([]byte(string(pod.UID)+"/"+c.Name))),
			Ready:       ready,
			Started:     ptr(true),
		}
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
		isInit := false
		for _, ic := range pod.Spec.InitContainers {
			if ic.Name == c.Name {
				isInit = true
			}
		}
		if isInit && !sidecar {
			cs.Started = ptr(false)
			cs.Ready = true
			cs.State.Terminated = &v1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: startedAt, FinishedAt: startedAt, ContainerID: cs.ContainerID,
			}
			for _, o := range old {
				if o.Name == c.Name && o.State.Terminated != nil {
					cs.State.Terminated = o.State.Terminated
				}
			}
		} else {
			cs.State.Running = &v1.ContainerStateRunning{StartedAt: startedAt}
		}
		out = append(out, cs)
	}
	return out
}

func imageID(image string) string {
	return fmt.Sprintf("%s@sha256:%x", strings.SplitN(image, ":", 2)[0], sha256.Sum256([]byte(image)))
}

func findCondition(conds []v1.PodCondition, t v1.PodConditionType) *v1.PodCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// setCondition sets a condition, keeping its transition time if unchanged.
func setCondition(s *v1.PodStatus, t v1.PodConditionType, ok bool, reason string) {
	status := v1.ConditionFalse
	if ok {
		status = v1.ConditionTrue
	}
	if c := findCondition(s.Conditions, t); c != nil {
		if c.Status != status {
			c.LastTransitionTime = now()
		}
		c.Status, c.Reason, c.Message = status, reason, ""
		return
	}
	s.Conditions = append(s.Conditions, v1.PodCondition{Type: t, Status: status, Reason: reason, LastTransitionTime: now()})
}

// heartbeat creates or refreshes the Node, its Ready status and its Lease.
func (k *kubelet) heartbeat(ctx context.Context) error {
	nodes := k.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, k.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nodes.Create(ctx, k.newNode(), metav1.CreateOptions{})
	}
	if err != nil {
		return err
	}
	t := metav1.Now()
	updated := node.DeepCopy()
	k.fillNodeStatus(&updated.Status, t)
	if _, err := nodes.UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return err
	}
	return k.renewLease(ctx, node, t)
}

func (k *kubelet) newNode() *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: k.nodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": k.nodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     runtime.GOARCH,
				"type":                   "fake-kubelet",
			},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: v1.NodeSpec{PodCIDR: k.podCIDR, PodCIDRs: []string{k.podCIDR}},
	}
}

func (k *kubelet) fillNodeStatus(s *v1.NodeStatus, t metav1.Time) {
	res := v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse("32"),
		v1.ResourceMemory:           resource.MustParse("256Gi"),
		v1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
		v1.ResourcePods:             resource.MustParse("1000"),
	}
	s.Capacity, s.Allocatable = res, res
	s.Phase = v1.NodeRunning
	s.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: hostIP}, {Type: v1.NodeHostName, Address: k.nodeName}}
	s.NodeInfo = v1.NodeSystemInfo{
		KubeletVersion:          k.kubeletVer,
		OperatingSystem:         "linux",
		Architecture:            runtime.GOARCH,
		ContainerRuntimeVersion: "fake://" + k.kubeletVer,
		OSImage:                 "fake-kubelet (runs no containers)",
	}
	want := []v1.NodeCondition{
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
	}
	for _, w := range want {
		w.LastHeartbeatTime = t
		w.LastTransitionTime = t
		found := false
		for i := range s.Conditions {
			if s.Conditions[i].Type == w.Type {
				if s.Conditions[i].Status == w.Status {
					w.LastTransitionTime = s.Conditions[i].LastTransitionTime
				}
				s.Conditions[i] = w
				found = true
			}
		}
		if !found {
			s.Conditions = append(s.Conditions, w)
		}
	}
}

func (k *kubelet) renewLease(ctx context.Context, node *v1.Node, t metav1.Time) error {
	leases := k.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	renew := metav1.NewMicroTime(t.Time)
	lease, err := leases.Get(ctx, k.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:      k.nodeName,
				Namespace: v1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr(k.nodeName),
				LeaseDurationSeconds: ptr(int32(leaseSeconds)),
				RenewTime:            &renew,
			},
		}, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	}
	lease.Spec.HolderIdentity = ptr(k.nodeName)
	lease.Spec.LeaseDurationSeconds = ptr(int32(leaseSeconds))
	lease.Spec.RenewTime = &renew
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

func ptr[T any](v T) *T { return &v }

// ipam hands out pod IPs from a CIDR. The addresses are only reported in
// pod status; nothing listens on them.
type ipam struct {
	mu    sync.Mutex
	base  *big.Int
	size  int64
	next  int64
	byIP  map[string]types.UID
	byUID map[types.UID]string
	v6    bool
}

func newIPAM(cidr string) (*ipam, error) {
	ip, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr: %w", err)
	}
	ones, bits := n.Mask.Size()
	if bits-ones < 2 {
		return nil, fmt.Errorf("--pod-cidr %s is too small", cidr)
	}
	size := int64(1) << min(bits-ones, 30)
	v6 := ip.To4() == nil
	raw := n.IP.To16()
	if !v6 {
		raw = n.IP.To4()
	}
	return &ipam{
		base: new(big.Int).SetBytes(raw), size: size, next: 2, v6: v6,
		byIP: map[string]types.UID{}, byUID: map[types.UID]string{},
	}, nil
}

func (a *ipam) ipAt(off int64) string {
	v := new(big.Int).Add(a.base, big.NewInt(off)).Bytes()
	width := 4
	if a.v6 {
		width = 16
	}
	buf := make([]byte, width)
	copy(buf[width-len(v):], v)
	return net.IP(buf).String()
}

func (a *ipam) reserve(ip string, uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.byIP[ip] = uid
	a.byUID[uid] = ip
}

func (a *ipam) release(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.byUID[uid]; ok {
		delete(a.byUID, uid)
		if a.byIP[ip] == uid {
			delete(a.byIP, ip)
		}
	}
}

func (a *ipam) allocate(uid types.UID) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.byUID[uid]; ok {
		return ip, nil
	}
	for range a.size {
		off := a.next
		a.next++
		if a.next >= a.size-1 {
			a.next = 2
		}
		ip := a.ipAt(off)
		if _, used := a.byIP[ip]; !used {
			a.byIP[ip] = uid
			a.byUID[uid] = ip
			return ip, nil
		}
	}
	return "", errors.New("pod CIDR exhausted")
}
