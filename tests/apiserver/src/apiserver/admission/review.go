// Package admission builds what kube-apiserver sends to an admission webhook and applies what
// it gets back, as k8s.io/apiserver's webhook code does:
//   - pkg/admission/plugin/webhook/request/admissionreview.go: CreateV1AdmissionReview
//   - pkg/admission/plugin/webhook/mutating/dispatcher.go: callAttrMutatingHook (the patch
//     decoded with jsonpatch.DecodePatch and applied with Apply to the object's JSON)
//   - pkg/registry/rest/create.go BeforeCreate: what the object gains between the mutating and
//     the validating webhooks (generated name, uid, creationTimestamp, the strategy's changes)
//
// The answer is verified by apiserver/webhookclient (VerifyAdmissionResponse).
package admission

import (
	"crypto/rand"
	"fmt"
	"time"

	"apiserver/object"
)

// Kind is the group/version/kind and group/version/resource of an intercepted object.
type Kind struct {
	Group, Version, Kind, Resource string
}

// The kinds modelgate intercepts on CREATE.
var (
	PodKind = Kind{"", "v1", "Pod", "pods"}
	JobKind = Kind{"batch", "v1", "Job", "jobs"}
)

// APIVersion is the object's apiVersion field.
func (k Kind) APIVersion() string {
	if k.Group == "" {
		return k.Version
	}
	return k.Group + "/" + k.Version
}

// User is the authenticated requester.
type User struct {
	Username string
	Groups   []string
	// FieldManager is what the client names itself in CreateOptions (kubectl) or "" (a
	// controller's typed client sends none).
	FieldManager string
}

// Users who create the objects of the harness.
var (
	// kubectl create/apply by a kubeadm cluster admin.
	Admin = User{"kubernetes-admin", []string{"kubeadm:cluster-admins", "system:authenticated"}, "kubectl-create"}
	// pkg/controller/job, with its service account credentials (--use-service-account-credentials).
	JobController = User{"system:serviceaccount:kube-system:job-controller",
		[]string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, ""}
	// the ReplicaSet, StatefulSet, DaemonSet, ... controllers (same identity scheme).
	ReplicaSetController = User{"system:serviceaccount:kube-system:replicaset-controller",
		[]string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, ""}
)

// NewReview is CreateV1AdmissionReview for a CREATE of obj in namespace: kind and resource as
// the webhook is registered for them (v1 Pod, batch/v1 Job, no conversion), requestKind the
// same, name empty for a generateName object, dryRun false, CreateOptions. It returns the uid
// the answer must echo.
func NewReview(kind Kind, obj object.Object, namespace string, user User) (string, object.Object) {
	return newReview(kind, "CREATE", obj, nil, namespace, user)
}

// NewUpdateReview is CreateV1AdmissionReview for an UPDATE of old to obj: oldObject set,
// UpdateOptions, the rest as NewReview.
func NewUpdateReview(kind Kind, obj, old object.Object, namespace string, user User) (string, object.Object) {
	return newReview(kind, "UPDATE", obj, old, namespace, user)
}

func newReview(kind Kind, operation string, obj, old object.Object, namespace string, user User) (string, object.Object) {
	uid := NewUID()
	optionsKind := "CreateOptions"
	if operation == "UPDATE" {
		optionsKind = "UpdateOptions"
	}
	options := object.Object{"apiVersion": "meta.k8s.io/v1", "kind": optionsKind}
	if user.FieldManager != "" {
		options["fieldManager"] = user.FieldManager
		options["fieldValidation"] = "Strict"
	}
	gvk := object.Object{"group": kind.Group, "version": kind.Version, "kind": kind.Kind}
	gvr := object.Object{"group": kind.Group, "version": kind.Version, "resource": kind.Resource}
	groups := make([]interface{}, len(user.Groups))
	for i, g := range user.Groups {
		groups[i] = g
	}
	request := object.Object{
		"uid":             uid,
		"kind":            gvk,
		"resource":        gvr,
		"requestKind":     gvk,
		"requestResource": gvr,
		"namespace":       namespace,
		"operation":       operation,
		"userInfo":        object.Object{"username": user.Username, "uid": NewUID(), "groups": groups},
		"object":          obj,
		"oldObject":       nil,
		"dryRun":          false,
		"options":         options,
	}
	if old != nil {
		request["oldObject"] = old
	}
	if name := object.Str(object.Get(obj, "metadata", "name")); name != "" {
		request["name"] = name
	}
	return uid, object.Object{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
}

// Prepare is what the create handler does to the decoded object before admission: apiVersion
// and kind set by the typed encoder, metadata.namespace made the request's
// (rest.EnsureObjectNamespaceMatchesRequestNamespace), and managedFields recorded by the field
// manager (FieldManager.UpdateNoErrors runs before admission).
func Prepare(kind Kind, obj object.Object, namespace string, user User) {
	obj["apiVersion"] = kind.APIVersion()
	obj["kind"] = kind.Kind
	meta := object.Child(obj, "metadata")
	meta["namespace"] = namespace
	manager := user.FieldManager
	if manager == "" {
		manager = "kube-controller-manager"
	}
	meta["managedFields"] = []interface{}{object.Object{
		"manager":    manager,
		"operation":  "Update",
		"apiVersion": kind.APIVersion(),
		"time":       time.Now().UTC().Format(time.RFC3339),
		"fieldsType": "FieldsV1",
		"fieldsV1":   object.Object{"f:spec": object.Object{}},
	}}
}

// BeforeCreate is rest.BeforeCreate, which runs after the mutating and before the validating
// webhooks: the strategy's PrepareForCreate (Pod: status Pending with its QoS class; Job:
// generateSelectorIfNeeded, generation 1), a generated name for a generateName object, uid
// and creationTimestamp (FillObjectMetaSystemFields).
func BeforeCreate(kind Kind, obj object.Object, qosClass string) {
	meta := object.Child(obj, "metadata")
	if object.Str(meta["name"]) == "" {
		meta["name"] = generateName(object.Str(meta["generateName"]))
	}
	meta["uid"] = NewUID()
	meta["creationTimestamp"] = time.Now().UTC().Format(time.RFC3339)
	switch kind {
	case PodKind:
		obj["status"] = object.Object{"phase": "Pending", "qosClass": qosClass}
	case JobKind:
		meta["generation"] = object.Num(1)
		obj["status"] = object.Object{}
		if manual, _ := object.Bool(object.Get(obj, "spec", "manualSelector")); !manual {
			generateSelector(obj)
		}
	}
}

// generateSelector is pkg/registry/batch/job/strategy.go generateSelector.
func generateSelector(job object.Object) {
	meta := object.Map(job["metadata"])
	name, uid := object.Str(meta["name"]), object.Str(meta["uid"])
	spec := object.Child(job, "spec")
	labels := object.Child(object.Child(object.Child(spec, "template"), "metadata"), "labels")
	for _, k := range []string{"job-name", "batch.kubernetes.io/job-name"} {
		object.SetDefault(labels, k, name)
	}
	for _, k := range []string{"controller-uid", "batch.kubernetes.io/controller-uid"} {
		object.SetDefault(labels, k, uid)
	}
	matchLabels := object.Child(object.Child(spec, "selector"), "matchLabels")
	object.SetDefault(matchLabels, "batch.kubernetes.io/controller-uid", uid)
}

// NewUID is a random (version 4) UUID, as uuid.NewUUID gives.
func NewUID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
