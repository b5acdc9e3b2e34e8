package state

import (
	"errors"
	"strings"
)

// Kinds of the Kubernetes objects this package converts, as ObjectError.Kind holds them.
const (
	KindService       = "Service"
	KindEndpointSlice = "EndpointSlice"
	KindNode          = "Node"
	KindServiceCIDR   = "ServiceCIDR"
)

// FieldError is one invalid field of a Kubernetes object.
type FieldError struct {
	// Field is the field's path in the object, as kubectl spells it
	// (for example "spec.ports[1].protocol").
	Field string
	// Err says what is wrong with the field's value.
	Err error
}

// Error returns "field: problem".
func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }

// Unwrap returns the underlying problem.
func (e *FieldError) Unwrap() error { return e.Err }

// ObjectError is the error for a Kubernetes object that cannot be proxied because it
// is malformed. It carries every invalid field of the object, not only the first, so
// that one look at the log tells the whole story.
type ObjectError struct {
	// Kind is KindService, KindEndpointSlice, KindNode or KindServiceCIDR.
	Kind string
	// Namespace is empty for cluster-scoped objects (Nodes, ServiceCIDRs).
	Namespace string
	Name      string
	// Fields are the paths of the invalid fields, in the order they were found.
	Fields []string
	// Err is the errors.Join of the problems, one *FieldError per invalid field.
	Err error
}

// Object returns "kind namespace/name" (or "kind name" for a cluster-scoped object),
// with the kind in lower case, as messages name the object.
func (e *ObjectError) Object() string {
	if e.Namespace == "" {
		return strings.ToLower(e.Kind) + " " + e.Name
	}
	return strings.ToLower(e.Kind) + " " + e.Namespace + "/" + e.Name
}

// Error returns the object's name followed by its problems on one line, for example
// `service default/web: spec.ports[1].protocol: unsupported protocol "TCPX"`.
func (e *ObjectError) Error() string {
	var msgs []string
	if j, ok := e.Err.(interface{ Unwrap() []error }); ok {
		for _, err := range j.Unwrap() {
			msgs = append(msgs, err.Error())
		}
	} else if e.Err != nil {
		msgs = append(msgs, e.Err.Error())
	}
	return e.Object() + ": " + strings.Join(msgs, "; ")
}

// Unwrap returns the joined field errors, so errors.As finds each *FieldError.
func (e *ObjectError) Unwrap() error { return e.Err }

// fieldErrors collects the problems of one object while it is converted.
type fieldErrors struct {
	errs []error
}

// add records that field is invalid because of err.
func (f *fieldErrors) add(field string, err error) {
	f.errs = append(f.errs, &FieldError{Field: field, Err: err})
}

// addMsg records that field is invalid, with a message.
func (f *fieldErrors) addMsg(field, msg string) { f.add(field, errors.New(msg)) }

// objectError returns nil when nothing was recorded, else an *ObjectError naming
// the object.
func (f *fieldErrors) objectError(kind, namespace, name string) error {
	if len(f.errs) == 0 {
		return nil
	}
	oe := &ObjectError{Kind: kind, Namespace: namespace, Name: name, Err: errors.Join(f.errs...)}
	for _, err := range f.errs {
		var fe *FieldError
		if errors.As(err, &fe) {
			oe.Fields = append(oe.Fields, fe.Field)
		}
	}
	return oe
}
