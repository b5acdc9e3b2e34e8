package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// The node agent: what the kubelet would write for the lab's nodes and pods.

// registerNode creates the Node object of n with its pod CIDR, and writes its status
// (InternalIP, Ready) as a kubelet would. In a dual-stack lab the Node has an InternalIP
// of each family and no pod CIDR: it waits for the node IPAM's and routes them.
func (c *Cluster) registerNode(ctx context.Context, n *Node) error {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Spec.Name, Labels: map[string]string{
			"kubernetes.io/hostname": n.Spec.Name,
			"kubernetes.io/os":       "linux",
		}},
	}
	maps.Copy(node.Labels, n.Spec.Labels)
	if !c.Spec.DualStack {
		node.Spec = v1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}}
	}
	created, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("node %s: create: %w", n.Spec.Name, err)
	}
	now := metav1.Now()
	addrs := []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: n.Addr.String()}}
	if n.Addr6.IsValid() {
		addrs = append(addrs, v1.NodeAddress{Type: v1.NodeInternalIP, Address: n.Addr6.String()})
	}
	status := v1.NodeStatus{
		Addresses: append(addrs, v1.NodeAddress{Type: v1.NodeHostName, Address: n.Spec.Name}),
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue,
			Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}},
	}
	// The node IPAM may have written the pod CIDRs since the create: then again on the
	// Node as it is.
	for try := 0; ; try++ {
		created.Status = status
		_, err = c.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) || try == 5 {
			break
		}
		if created, err = c.Client.CoreV1().Nodes().Get(ctx, n.Spec.Name, metav1.GetOptions{}); err != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("node %s: status: %w", n.Spec.Name, err)
	}
	if !c.Spec.DualStack {
		return nil
	}
	if err := c.podCIDRsOf(ctx, n); err != nil {
		return err
	}
	return c.routePods(n)
}

// PodSpec describes a pod of the lab.
type PodSpec struct {
	Namespace, Name string
	// Node is the name of the node the pod is bound to.
	Node   string
	Labels map[string]string
	// Ports are the TCP ports the pod's echo server answers on (and declares).
	Ports []uint16
	// DeclaredPorts are container ports the Pod object declares besides Ports, which no
	// echo server answers: named ports (a Service's named targetPort resolves through
	// them, by name and protocol) and ports of other protocols.
	DeclaredPorts []v1.ContainerPort
	// StreamPorts are TCP ports where the pod answers every line of a connection until
	// the client closes it (long-lived connections, see Traffic), declared too.
	StreamPorts []uint16
}

// Pod is a pod namespace behind its node, with its echo server and its API object.
type Pod struct {
	*lab.NS
	Spec PodSpec
	// Addr is the pod's IP; Addr6 its IPv6 one in a dual-stack lab, else zero.
	Addr, Addr6 netip.Addr
	// HostVeth is the name of the pod veth's end in the node's namespace.
	HostVeth string

	echo   *lab.EchoServer
	stream *streamServer
}

func (p *Pod) stop() error {
	var errs []error
	if p.echo != nil {
		errs = append(errs, p.echo.Stop())
	}
	if p.stream != nil {
		errs = append(errs, p.stream.stop())
	}
	return errors.Join(errs...)
}

// AddPod creates the Pod object bound to its node, wires a pod namespace behind the node
// (an address of the node's pod CIDR, routed through a veth), starts its echo server and
// writes the pod's status as the kubelet would: Running, its podIP, and Ready.
func (c *Cluster) AddPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	n := c.Node(spec.Node)
	if n == nil {
		return nil, fmt.Errorf("pod %s/%s: no node %q", spec.Namespace, spec.Name, spec.Node)
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	n.mu.Lock()
	n.nextPod++
	index := n.nextPod
	n.mu.Unlock()
	if index > 250 {
		return nil, fmt.Errorf("pod %s/%s: node %s is full", spec.Namespace, spec.Name, n.Spec.Name)
	}
	gw, gw6 := n.PodCIDR.Addr().Next(), netip.Addr{}
	addr, addr6 := nthAfter(gw, index), netip.Addr{}
	if n.PodCIDR6.IsValid() {
		gw6 = n.PodCIDR6.Addr().Next()
		addr6 = nthAfter(gw6, index)
	}

	var ports []v1.ContainerPort
	for _, p := range spec.Ports {
		ports = append(ports, v1.ContainerPort{ContainerPort: int32(p), Protocol: v1.ProtocolTCP})
	}
	for _, p := range spec.StreamPorts {
		ports = append(ports, v1.ContainerPort{ContainerPort: int32(p), Protocol: v1.ProtocolTCP})
	}
	ports = append(ports, spec.DeclaredPorts...)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name, Labels: spec.Labels},
		Spec: v1.PodSpec{
			NodeName:                     n.Spec.Name,
			AutomountServiceAccountToken: new(bool),
			Containers:                   []v1.Container{{Name: "echo", Image: "nftproxy.io/lab-echo", Ports: ports}},
		},
	}
	// The serviceaccount controller makes the namespace's default ServiceAccount, without
	// which the API server refuses pods, shortly after the namespace appears.
	var created *v1.Pod
	err := waitFor(ctx, defaultWait, "create pod "+spec.Namespace+"/"+spec.Name, func() (bool, error) {
		var err error
		created, err = c.Client.CoreV1().Pods(spec.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		return err == nil, err
	})
	if err != nil {
		return nil, err
	}

	ns, err := c.newNS("pod-"+spec.Name, nil)
	if err != nil {
		return nil, err
	}
	p := &Pod{NS: ns, Spec: spec, Addr: addr, Addr6: addr6, HostVeth: fmt.Sprintf("veth%d", index)}
	c.mu.Lock()
	c.pods = append(c.pods, p)
	c.mu.Unlock()
	if err := addVeth(n.NS, p.HostVeth, ns, "eth0"); err != nil {
		return nil, err
	}
	if err := wireAddr(n.NS, p.HostVeth, ns, addr, gw); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	if addr6.IsValid() {
		if err := wireAddr(n.NS, p.HostVeth, ns, addr6, gw6); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", spec.Namespace, spec.Name, err)
		}
	}
	if len(spec.Ports) > 0 {
		var eps []lab.EchoPort
		for _, port := range spec.Ports {
			eps = append(eps, lab.EchoPort{Proto: lab.TCP, Port: port}, lab.EchoPort{Proto: lab.UDP, Port: port})
		}
		if p.echo, err = lab.StartEcho(ns, spec.Name, p.Addrs(), eps); err != nil {
			return nil, err
		}
	}
	if len(spec.StreamPorts) > 0 {
		if p.stream, err = startStreamServer(ns, spec.Name, addr, spec.StreamPorts); err != nil {
			return nil, err
		}
	}

	now := metav1.Now()
	hostIPs, podIPs := []v1.HostIP{{IP: n.Addr.String()}}, []v1.PodIP{{IP: addr.String()}}
	if addr6.IsValid() {
		hostIPs, podIPs = append(hostIPs, v1.HostIP{IP: n.Addr6.String()}), append(podIPs, v1.PodIP{IP: addr6.String()})
	}
	created.Status = v1.PodStatus{
		Phase:     v1.PodRunning,
		HostIP:    n.Addr.String(),
		HostIPs:   hostIPs,
		PodIP:     addr.String(),
		PodIPs:    podIPs,
		StartTime: &now,
		Conditions: []v1.PodCondition{
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
			{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now},
			{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
			{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []v1.ContainerStatus{{Name: "echo", Image: "nftproxy.io/lab-echo", Ready: true,
			Started: new(bool), State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}}},
	}
	*created.Status.ContainerStatuses[0].Started = true
	if _, err := c.Client.CoreV1().Pods(spec.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("pod %s/%s: status: %w", spec.Namespace, spec.Name, err)
	}
	return p, nil
}

// Terminate deletes the pod with a grace period, as `kubectl delete` does: the API server
// marks it terminating (deletionTimestamp) and the pod keeps running and serving — and
// Ready, as a kubelet whose readiness probe still passes reports it — until Remove, which
// the kubelet would do when the containers have exited or the grace period has passed.
func (c *Cluster) Terminate(ctx context.Context, p *Pod, grace time.Duration) error {
	secs := int64(grace / time.Second)
	if secs < 1 {
		secs = 1 // 0 would delete at once, without a terminating phase
	}
	err := c.Client.CoreV1().Pods(p.Spec.Namespace).Delete(ctx, p.Spec.Name, metav1.DeleteOptions{GracePeriodSeconds: &secs})
	if err != nil {
		return fmt.Errorf("pod %s/%s: delete with grace %ds: %w", p.Spec.Namespace, p.Spec.Name, secs, err)
	}
	return nil
}

// Remove stops the pod (its echo server and namespace, with which its veth goes) and
// deletes its object for good, as the kubelet does once the containers have exited.
func (c *Cluster) Remove(ctx context.Context, p *Pod) error {
	errs := []error{p.stop(), p.NS.Close()}
	c.mu.Lock()
	c.pods = slices.DeleteFunc(c.pods, func(q *Pod) bool { return q == p })
	c.mu.Unlock()
	err := c.Client.CoreV1().Pods(p.Spec.Namespace).Delete(ctx, p.Spec.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("pod %s/%s: delete: %w", p.Spec.Namespace, p.Spec.Name, err))
	}
	return errors.Join(errs...)
}

// Addrs returns the pod's addresses: IPv4, then IPv6 in a dual-stack lab.
func (p *Pod) Addrs() []netip.Addr {
	if p.Addr6.IsValid() {
		return []netip.Addr{p.Addr, p.Addr6}
	}
	return []netip.Addr{p.Addr}
}

// wireAddr gives the pod namespace pod, behind veth of the node namespace node, the
// address a: the node's end of the veth holds the pods' gateway gw of a's family and
// routes a to the pod, which reaches gw on link and takes it as its default route.
func wireAddr(node *lab.NS, veth string, pod *lab.NS, a, gw netip.Addr) error {
	deflt := netip.Prefix{}
	if a.Is6() {
		deflt = netip.MustParsePrefix("::/0")
	}
	steps := []func() error{
		func() error { return addAddr(node, veth, netip.PrefixFrom(gw, gw.BitLen())) },
		func() error { return addRoute(node, veth, netip.PrefixFrom(a, a.BitLen()), netip.Addr{}) },
		func() error { return addAddr(pod, "eth0", netip.PrefixFrom(a, a.BitLen())) },
		func() error { return addRoute(pod, "eth0", deflt, gw) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
	}
	return nil
}

// nthAfter returns the address n after a.
func nthAfter(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}
