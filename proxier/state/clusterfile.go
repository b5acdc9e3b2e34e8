package state

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// DocumentError is an error located in a cluster file.
type DocumentError struct {
	// File is the file's name as the caller gave it.
	File string
	// Document is the 1-based index of the document, counting only documents that
	// hold something other than comments.
	Document int
	// Line is the 1-based line of the offending field when it could be found, else
	// of the document's first line of content.
	Line int
	Err  error
}

// Error returns "file: document N (line L): problem".
func (e *DocumentError) Error() string {
	return fmt.Sprintf("%s: document %d (line %d): %v", e.File, e.Document, e.Line, e.Err)
}

// Unwrap returns the problem, an *ObjectError when the problem is one object's.
func (e *DocumentError) Unwrap() error { return e.Err }

// LoadClusterFile reads a cluster file (see LoadCluster).
func LoadClusterFile(path, nodeName string) (*ClusterState, []error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster file: %w", err)
	}
	defer f.Close()
	return LoadCluster(f, path, nodeName)
}

// LoadCluster reads a cluster file from r and returns the state node nodeName would
// proxy. A cluster file is multi-document Kubernetes YAML holding v1 Services,
// discovery.k8s.io/v1 EndpointSlices, v1 Nodes and networking.k8s.io/v1
// ServiceCIDRs, or v1 Lists of them (as
// `kubectl get -o yaml` prints), decoded strictly: unknown and duplicate fields are
// errors. An empty namespace means "default", as for kubectl apply.
//
// The error is fatal: unreadable or unparsable YAML, an unknown kind or apiVersion,
// or an unknown field, each a *DocumentError naming the file (name), the document
// and the line; or several Nodes with nodeName "". The []error are per object, each
// a *DocumentError wrapping the object's *ObjectError (or reporting a duplicate of
// an earlier object): such objects are skipped, and the rest loads, through a
// Tracker as the daemon's informers do. The returned state belongs to the caller.
//
// With nodeName "" the only Node of the file is used; a node without a Node in the
// file is an empty Node of that name.
func LoadCluster(r io.Reader, name, nodeName string) (*ClusterState, []error, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	objs, err := decodeCluster(data, name, nil)
	if err != nil {
		return nil, nil, err
	}

	if nodeName == "" {
		var nodes []string
		for _, o := range objs {
			if n, ok := o.obj.(*v1.Node); ok && !slices.Contains(nodes, n.Name) {
				nodes = append(nodes, n.Name)
			}
		}
		switch len(nodes) {
		case 0:
		case 1:
			nodeName = nodes[0]
		default:
			return nil, nil, fmt.Errorf("%s: %d Nodes (%s) and no node name to choose one", name, len(nodes), strings.Join(nodes, ", "))
		}
	}

	t := NewTracker(nodeName)
	errs := t.applyObjects(objs)
	return t.State(), errs, nil
}

// ApplyYAML decodes cluster YAML, in the format LoadCluster reads, and records every
// object in t as an update. name is used in errors. The error is fatal (nothing was
// applied); the []error are per object, and those objects were skipped.
func (t *Tracker) ApplyYAML(data []byte, name string) ([]error, error) {
	f, err := DecodeClusterFile(data, name, false)
	if err != nil {
		return nil, err
	}
	return f.Apply(t), nil
}

// ClusterFile is decoded cluster YAML, to be recorded in Trackers (Apply).
type ClusterFile struct {
	objs []*clusterObject
	// Skipped holds the kind of each object DecodeClusterFile skipped, in the order
	// of the file.
	Skipped []string
}

// DecodeClusterFile decodes cluster YAML as LoadCluster reads it; name is used in
// errors. With skipOthers, objects of kinds other than Service, EndpointSlice, Node
// and ServiceCIDR (the Pods, Deployments and ConfigMaps `kubectl get all -o yaml`
// prints) are skipped and their kinds listed in Skipped instead of refused; a kind
// of those four in another apiVersion is still refused.
func DecodeClusterFile(data []byte, name string, skipOthers bool) (*ClusterFile, error) {
	f := &ClusterFile{}
	var skipped *[]string
	if skipOthers {
		skipped = &f.Skipped
	}
	objs, err := decodeCluster(data, name, skipped)
	if err != nil {
		return nil, err
	}
	f.objs = objs
	return f, nil
}

// Nodes returns the file's Nodes, in the order of the file.
func (f *ClusterFile) Nodes() []*v1.Node {
	var out []*v1.Node
	for _, o := range f.objs {
		if n, ok := o.obj.(*v1.Node); ok {
			out = append(out, n)
		}
	}
	return out
}

// Apply records the file's objects in t as updates and returns the errors of the
// objects skipped, as ApplyYAML does.
func (f *ClusterFile) Apply(t *Tracker) []error {
	return t.applyObjects(f.objs)
}

// applyObjects records objs in t, skipping repeated objects and reporting each
// object's error at the line of its first invalid field.
func (t *Tracker) applyObjects(objs []*clusterObject) []error {
	var errs []error
	seen := map[objectKey]*clusterObject{}
	for _, o := range objs {
		key := o.key()
		if first, dup := seen[key]; dup {
			errs = append(errs, o.errorf("%s: duplicate of document %d (line %d), skipped",
				objectName(key), first.doc, first.line))
			continue
		}
		seen[key] = o
		var err error
		switch obj := o.obj.(type) {
		case *v1.Service:
			err = t.UpdateService(obj)
		case *discoveryv1.EndpointSlice:
			err = t.UpdateEndpointSlice(obj)
		case *v1.Node:
			err = t.UpdateNode(obj)
		case *networkingv1.ServiceCIDR:
			err = t.UpdateServiceCIDR(obj)
		}
		if err != nil {
			errs = append(errs, o.locate(err))
		}
	}
	return errs
}

// clusterObject is one decoded object of a cluster file, with where it came from.
type clusterObject struct {
	obj  any // *v1.Service, *discoveryv1.EndpointSlice, *v1.Node or *networkingv1.ServiceCIDR
	file string
	doc  int
	// line is the object's first line of content.
	line int
	// path is the object's path in its document: "" or "items[i]" in a List.
	path string
	// yamlDoc and firstLine locate fields: the document's text and the index of its
	// first line in the file.
	yamlDoc   []byte
	firstLine int
	// skipped, when not nil, collects the kinds of objects of other kinds, which
	// are then skipped rather than refused (DecodeClusterFile's skipOthers).
	skipped *[]string
}

// key identifies the object.
func (o *clusterObject) key() objectKey {
	switch obj := o.obj.(type) {
	case *v1.Service:
		return objectKey{KindService, obj.Namespace, obj.Name}
	case *discoveryv1.EndpointSlice:
		return objectKey{KindEndpointSlice, obj.Namespace, obj.Name}
	case *v1.Node:
		return objectKey{KindNode, "", obj.Name}
	case *networkingv1.ServiceCIDR:
		return objectKey{KindServiceCIDR, "", obj.Name}
	}
	return objectKey{}
}

// errorf returns a *DocumentError at the object's line.
func (o *clusterObject) errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	if o.path != "" {
		err = fmt.Errorf("%s: %w", o.path, err)
	}
	return &DocumentError{File: o.file, Document: o.doc, Line: o.line, Err: err}
}

// locate wraps err, an object's error, in a *DocumentError at the line of its first
// invalid field.
func (o *clusterObject) locate(err error) error {
	line := o.line
	var oe *ObjectError
	if errors.As(err, &oe) && len(oe.Fields) > 0 {
		line = locateField(o.yamlDoc, o.firstLine, joinPath(o.path, oe.Fields[0]), o.line)
	}
	if o.path != "" {
		err = fmt.Errorf("%s: %w", o.path, err)
	}
	return &DocumentError{File: o.file, Document: o.doc, Line: line, Err: err}
}

// decodeCluster splits data into documents and decodes each, strictly. When skipped
// is not nil, objects of kinds a cluster file does not hold are left out and their
// kinds appended to it.
func decodeCluster(data []byte, file string, skipped *[]string) ([]*clusterObject, error) {
	lines := bytes.Split(data, []byte("\n"))
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []*clusterObject
	next, docIndex := 0, 0 // next is the index of the first line not yet read
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			return objs, nil
		}
		if err != nil {
			line := next + 1
			for i := next; i < len(lines); i++ {
				if badSeparator(lines[i]) {
					line = i + 1
					break
				}
			}
			return nil, &DocumentError{File: file, Document: docIndex + 1, Line: line, Err: err}
		}
		// The reader drops separator lines and returns the lines between them, so
		// the document starts after the separators at next.
		for next < len(lines) && bytes.HasPrefix(lines[next], []byte("---")) {
			next++
		}
		first := next
		next += bytes.Count(doc, []byte("\n"))
		content := firstContentLine(doc)
		if content < 0 {
			continue
		}
		docIndex++
		o := &clusterObject{file: file, doc: docIndex, line: first + content + 1, yamlDoc: doc, firstLine: first, skipped: skipped}
		docObjs, err := decodeDocument(o)
		if err != nil {
			return nil, err
		}
		objs = append(objs, docObjs...)
	}
}

// badSeparator reports whether line is a document separator the YAML reader refuses.
func badSeparator(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("---"))
	rest = bytes.TrimSpace(rest)
	return ok && len(rest) > 0 && rest[0] != '#'
}

// firstContentLine returns the 0-based index of the first line of doc that is not
// blank or a comment, or -1 when there is none.
func firstContentLine(doc []byte) int {
	for i, l := range bytes.Split(doc, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' {
			return i
		}
	}
	return -1
}

// yamlLineRE finds the line number in the YAML parser's messages.
var yamlLineRE = regexp.MustCompile(`line (\d+): `)

// typeMeta is what tells the kind of a document, and names it in errors.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
}

// decodeDocument decodes the document of o into one object, or several for a List.
func decodeDocument(o *clusterObject) ([]*clusterObject, error) {
	j, err := yaml.YAMLToJSONStrict(o.yamlDoc)
	if err != nil {
		line, msg := o.line, err.Error()
		if m := yamlLineRE.FindStringSubmatchIndex(msg); m != nil {
			n, _ := strconv.Atoi(msg[m[2]:m[3]])
			line, msg = o.firstLine+n, msg[m[1]:]
		}
		return nil, &DocumentError{File: o.file, Document: o.doc, Line: line, Err: fmt.Errorf("invalid YAML: %s", msg)}
	}
	if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
		return nil, nil
	}
	var tm typeMeta
	if !bytes.HasPrefix(bytes.TrimSpace(j), []byte("{")) || json.Unmarshal(j, &tm) != nil {
		return nil, o.errorf("not a Kubernetes object")
	}
	if tm.APIVersion == "v1" && tm.Kind == "List" {
		if o.path != "" {
			return nil, o.errorf("a List inside a List")
		}
		return decodeList(o, j)
	}
	obj, err := decodeObject(o, j, tm)
	if err != nil || obj == nil {
		return nil, err
	}
	o.obj = obj
	return []*clusterObject{o}, nil
}

// decodeList decodes the items of a v1 List, each as a document of its own.
func decodeList(o *clusterObject, j []byte) ([]*clusterObject, error) {
	var list struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ListMeta   `json:"metadata"`
		Items      []json.RawMessage `json:"items"`
	}
	if err := o.strictDecode(j, &list, nil); err != nil {
		return nil, err
	}
	var objs []*clusterObject
	for i, item := range list.Items {
		it := *o
		it.path = fmt.Sprintf("items[%d]", i)
		it.line = locateField(o.yamlDoc, o.firstLine, it.path, o.line)
		var tm typeMeta
		if !bytes.HasPrefix(bytes.TrimSpace(item), []byte("{")) || json.Unmarshal(item, &tm) != nil {
			return nil, it.errorf("not a Kubernetes object")
		}
		if tm.Kind == "List" {
			return nil, it.errorf("a List inside a List")
		}
		obj, err := decodeObject(&it, item, tm)
		if err != nil {
			return nil, err
		}
		if obj == nil {
			continue
		}
		it.obj = obj
		objs = append(objs, &it)
	}
	return objs, nil
}

// decodeObject decodes one Service, EndpointSlice, Node or ServiceCIDR, strictly,
// and defaults the namespace of namespaced objects. It returns nil for an object of
// another kind that o.skipped collects.
func decodeObject(o *clusterObject, j []byte, tm typeMeta) (any, error) {
	ns := tm.Metadata.Namespace
	if ns == "" {
		ns = "default"
	}
	switch {
	case tm.APIVersion == "v1" && tm.Kind == "Service":
		var svc v1.Service
		if err := o.strictDecode(j, &svc, &objectKey{KindService, ns, tm.Metadata.Name}); err != nil {
			return nil, err
		}
		if svc.Namespace == "" {
			svc.Namespace = "default"
		}
		return &svc, nil
	case tm.APIVersion == "discovery.k8s.io/v1" && tm.Kind == "EndpointSlice":
		var s discoveryv1.EndpointSlice
		if err := o.strictDecode(j, &s, &objectKey{KindEndpointSlice, ns, tm.Metadata.Name}); err != nil {
			return nil, err
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		return &s, nil
	case tm.APIVersion == "v1" && tm.Kind == "Node":
		var n v1.Node
		if err := o.strictDecode(j, &n, &objectKey{KindNode, "", tm.Metadata.Name}); err != nil {
			return nil, err
		}
		return &n, nil
	case tm.APIVersion == "networking.k8s.io/v1" && tm.Kind == "ServiceCIDR":
		var c networkingv1.ServiceCIDR
		if err := o.strictDecode(j, &c, &objectKey{KindServiceCIDR, "", tm.Metadata.Name}); err != nil {
			return nil, err
		}
		return &c, nil
	case tm.Kind == "":
		return nil, o.errorf("no kind")
	case o.skipped != nil && !slices.Contains([]string{"Service", "EndpointSlice", "Node", "ServiceCIDR"}, tm.Kind):
		*o.skipped = append(*o.skipped, tm.Kind)
		return nil, nil
	}
	return nil, o.errorf("unsupported kind %q of apiVersion %q: want v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Node, networking.k8s.io/v1 ServiceCIDR or v1 List", tm.Kind, tm.APIVersion)
}

// strictDecode decodes j into v, refusing unknown and duplicate fields as the API
// server does for kubectl's --validate=strict. key names the object in errors; nil
// stands for a List. Unknown fields make an *ObjectError with their paths.
func (o *clusterObject) strictDecode(j []byte, v any, key *objectKey) error {
	what := "list"
	if key != nil {
		what = objectName(*key)
	}
	strict, err := kjson.UnmarshalStrict(j, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return o.errorf("%s: %w", what, err)
	}
	if len(strict) == 0 {
		return nil
	}
	var fields []string
	for _, e := range strict {
		if fe, ok := e.(interface{ FieldPath() string }); ok {
			fields = append(fields, fe.FieldPath())
		}
	}
	line := o.line
	if len(fields) > 0 {
		line = locateField(o.yamlDoc, o.firstLine, joinPath(o.path, fields[0]), o.line)
	}
	err = errors.Join(strict...)
	if key != nil {
		err = &ObjectError{Kind: key.kind, Namespace: key.namespace, Name: key.name, Fields: fields, Err: err}
	} else {
		err = fmt.Errorf("%s: %s", what, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if o.path != "" {
		err = fmt.Errorf("%s: %w", o.path, err)
	}
	return &DocumentError{File: o.file, Document: o.doc, Line: line, Err: err}
}

// objectName names an object in messages, as ObjectError does.
func objectName(k objectKey) string {
	return (&ObjectError{Kind: k.kind, Namespace: k.namespace, Name: k.name}).Object()
}

// joinPath joins a field path to the path of its object in the document.
func joinPath(prefix, path string) string {
	if prefix == "" {
		return path
	}
	if strings.HasPrefix(path, "[") {
		return prefix + path
	}
	return prefix + "." + path
}

// locateField returns the 1-based file line of the field at path (such as
// "spec.ports[1].protocol" or "metadata.labels[kubernetes.io/service-name]") in doc,
// whose first line is line firstLine (0-based) of the file. When the path leads
// nowhere it returns the line of the deepest field found on the way, or fallback.
func locateField(doc []byte, firstLine int, path string, fallback int) int {
	var root yamlv3.Node
	if yamlv3.Unmarshal(doc, &root) != nil || len(root.Content) == 0 {
		return fallback
	}
	node, line := root.Content[0], 0
	for _, seg := range splitPath(path) {
		next, l := child(node, seg)
		if next == nil {
			break
		}
		node, line = next, l
	}
	if line == 0 {
		return fallback
	}
	return firstLine + line
}

// pathSegment is a field name, map key or list index of a field path.
type pathSegment struct {
	key   string
	index int // -1 for a key
}

// splitPath splits "a.b[1].c[some/key]" into a, b, 1, c, some/key.
func splitPath(path string) []pathSegment {
	var segs []pathSegment
	for path != "" {
		switch path[0] {
		case '.':
			path = path[1:]
		case '[':
			end := strings.IndexByte(path, ']')
			if end < 0 {
				return segs
			}
			s := path[1:end]
			if i, err := strconv.Atoi(s); err == nil {
				segs = append(segs, pathSegment{index: i})
			} else {
				segs = append(segs, pathSegment{key: strings.Trim(s, `"`), index: -1})
			}
			path = path[end+1:]
		default:
			end := strings.IndexAny(path, ".[")
			if end < 0 {
				end = len(path)
			}
			segs = append(segs, pathSegment{key: path[:end], index: -1})
			path = path[end:]
		}
	}
	return segs
}

// child returns the node at seg below n and the line that names it (the key's line
// in a mapping), or nil.
func child(n *yamlv3.Node, seg pathSegment) (*yamlv3.Node, int) {
	for n.Kind == yamlv3.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch {
	case seg.index >= 0 && n.Kind == yamlv3.SequenceNode && seg.index < len(n.Content):
		c := n.Content[seg.index]
		return c, c.Line
	case seg.index < 0 && n.Kind == yamlv3.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == seg.key {
				return n.Content[i+1], n.Content[i].Line
			}
		}
	}
	return nil, 0
}
