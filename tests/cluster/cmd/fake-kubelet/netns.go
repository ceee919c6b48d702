package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// The pod network of process pods. The API server refuses loopback
// addresses in EndpointSlices, so pods get addresses from the pod CIDR, and
// those addresses exist only inside network namespaces this kubelet makes:
//
//   - the node namespace "<prefix>-node" holds a bridge with the CIDR's
//     first address (the pods' default gateway);
//   - each process pod gets its own namespace "<prefix>-<n>" (n the
//     address's offset in the CIDR) with eth0 on that bridge.
//
// Nothing is routed to or from the machine's own network. The kubelet
// reaches pods (probes, hostPort) with sockets it opens inside the node
// namespace; a container port with a hostPort is forwarded from
// 127.0.0.1:hostPort, the node's address; and the ports listed in the node
// ConfigMap are forwarded the other way, from the pods' gateway address to
// the same port on 127.0.0.1 (how a pod reaches a service of its node). All of it is removed when the
// pod goes and when the kubelet stops; `tests/cluster/down` removes what a
// killed kubelet left behind.
type podNetwork struct {
	prefix    string
	cidr      *net.IPNet
	gateway   net.IP
	mu        sync.Mutex
	ready     bool
	jobs      chan func()
	nodePorts map[int]bool
}

func newPodNetwork(prefix string, cidr string) (*podNetwork, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, err
	}
	if n.IP.To4() == nil {
		return nil, errors.New("process pods need an IPv4 pod CIDR")
	}
	gw := make(net.IP, 4)
	copy(gw, n.IP.To4())
	gw[3]++
	return &podNetwork{prefix: prefix, cidr: n, gateway: gw, nodePorts: map[int]bool{}}, nil
}

func (n *podNetwork) nodeNS() string { return n.prefix + "-node" }

func (n *podNetwork) podNS(ip string) string {
	off := binary.BigEndian.Uint32(net.ParseIP(ip).To4()) - binary.BigEndian.Uint32(n.cidr.IP.To4())
	return fmt.Sprintf("%s-%d", n.prefix, off)
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func nsExists(name string) bool {
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}

// ensureNode makes the node namespace and its bridge once, and starts the
// threads that open sockets inside it.
func (n *podNetwork) ensureNode() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ready {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("process pods need root: their network namespaces are made with ip netns")
	}
	node := n.nodeNS()
	if nsExists(node) {
		_ = ipCmd("netns", "del", node) // left by a kubelet that was killed
	}
	ones, _ := n.cidr.Mask.Size()
	steps := [][]string{
		{"netns", "add", node},
		{"-n", node, "link", "set", "lo", "up"},
		{"-n", node, "link", "add", "br0", "type", "bridge"},
		{"-n", node, "addr", "add", fmt.Sprintf("%s/%d", n.gateway, ones), "dev", "br0"},
		{"-n", node, "link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	n.jobs = make(chan func())
	for range 4 {
		ready := make(chan error, 1)
		go n.nodeThread(ready)
		if err := <-ready; err != nil {
			return err
		}
	}
	n.ready = true
	klog.InfoS("pod network ready", "namespace", node, "gateway", n.gateway.String(), "cidr", n.cidr.String())
	return nil
}

// addPod makes the pod's namespace with eth0 at ip.
func (n *podNetwork) addPod(ip string) (string, error) {
	if err := n.ensureNode(); err != nil {
		return "", err
	}
	ns := n.podNS(ip)
	if nsExists(ns) {
		_ = ipCmd("netns", "del", ns)
	}
	ones, _ := n.cidr.Mask.Size()
	veth := "v" + strings.TrimPrefix(ns, n.prefix+"-")
	steps := [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", n.nodeNS(), "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", n.nodeNS(), "link", "set", veth, "master", "br0", "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", ip, ones), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", n.gateway.String()},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			_ = ipCmd("netns", "del", ns)
			return "", err
		}
	}
	return ns, nil
}

func (n *podNetwork) removePod(ns string) {
	if ns == "" || !nsExists(ns) {
		return
	}
	if err := ipCmd("netns", "del", ns); err != nil {
		klog.ErrorS(err, "removing pod network namespace", "namespace", ns)
	}
}

// removeAll removes the node namespace and every pod namespace of this
// prefix (at shutdown, after the processes are gone).
func (n *podNetwork) removeAll() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), n.prefix+"-") {
			_ = ipCmd("netns", "del", e.Name())
		}
	}
}

// execIn is the command line that runs argv inside a pod's namespace.
func execIn(ns string, argv []string) []string {
	return append([]string{"ip", "netns", "exec", ns}, argv...)
}

// nodeThread is a goroutine locked to an OS thread that has entered the
// node namespace: a socket belongs to the namespace of the thread that
// opened it, so connections opened and listeners made here are on the pod
// network. The thread never leaves the namespace and runs nothing else.
func (n *podNetwork) nodeThread(ready chan<- error) {
	runtime.LockOSThread()
	f, err := os.Open("/run/netns/" + n.nodeNS())
	if err == nil {
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
	}
	ready <- err
	if err != nil {
		return // the locked thread exits with this goroutine
	}
	for job := range n.jobs {
		job()
	}
}

// inNode runs f on a thread in the node namespace and waits for it.
func (n *podNetwork) inNode(ctx context.Context, f func()) error {
	if err := n.ensureNode(); err != nil {
		return err
	}
	done := make(chan struct{})
	select {
	case n.jobs <- func() { f(); close(done) }:
	case <-ctx.Done():
		return ctx.Err()
	}
	<-done
	return nil
}

// dial opens a connection to a pod address from the node namespace.
func (n *podNetwork) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	var err error
	if e := n.inNode(ctx, func() { conn, err = (&net.Dialer{}).DialContext(ctx, network, addr) }); e != nil {
		return nil, e
	}
	return conn, err
}

// forwardNodePorts lets pods reach services of this machine at their
// gateway address, as pods reach their node's address: a connection to
// gateway:port is copied to 127.0.0.1:port. Ports already forwarded stay.
func (n *podNetwork) forwardNodePorts(ports []int) error {
	for _, port := range ports {
		if err := n.forwardNodePort(port, port); err != nil {
			return err
		}
	}
	return nil
}

// forwardNodePort copies each connection to gateway:at to
// 127.0.0.1:port, unless gateway:at is forwarded already.
func (n *podNetwork) forwardNodePort(at, port int) error {
	n.mu.Lock()
	done := n.nodePorts[at]
	n.mu.Unlock()
	if done {
		return nil
	}
	var l net.Listener
	var err error
	addr := net.JoinHostPort(n.gateway.String(), fmt.Sprint(at))
	if e := n.inNode(context.Background(), func() { l, err = net.Listen("tcp", addr) }); e != nil {
		return e
	}
	if err != nil {
		return fmt.Errorf("node port %d: %w", at, err)
	}
	n.mu.Lock()
	n.nodePorts[at] = true
	n.mu.Unlock()
	klog.InfoS("forwarding a node port to pods", "address", addr, "to", fmt.Sprintf("%s:%d", hostIP, port))
	target := net.JoinHostPort(hostIP, strconv.Itoa(port))
	go serve(l, func() (net.Conn, error) { return net.DialTimeout("tcp", target, 5*time.Second) })
	return nil
}

// forward accepts on a host address and copies each connection to a pod
// address, until ctx ends.
func (n *podNetwork) forward(ctx context.Context, listen, target string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	go serve(l, func() (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return n.dial(dctx, "tcp", target)
	})
	return nil
}

// serve accepts until the listener closes and pipes each connection to
// one that dial opens.
func serve(l net.Listener, dial func() (net.Conn, error)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			p, err := dial()
			if err != nil {
				klog.V(2).InfoS("forward: cannot reach the other side", "listener", l.Addr().String(), "err", err)
				return
			}
			defer p.Close()
			pipe(c, p)
		}()
	}
}

// pipe copies both ways, passing on each side's end of stream.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go half(a, b)
	go half(b, a)
	<-done
	<-done
}
