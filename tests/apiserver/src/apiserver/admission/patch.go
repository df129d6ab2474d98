package admission

import (
	"fmt"

	jsonpatch "github.com/evanphx/json-patch"

	"apiserver/defaults"
	"apiserver/object"
)

// ApplyPatch is the JSONPatch branch of callAttrMutatingHook: jsonpatch.DecodePatch (the
// evanphx/json-patch v4 API kube-apiserver vendors as gopkg.in/evanphx/json-patch.v4), an
// empty operation list meaning "unchanged", Apply to the object's JSON, then the result
// decoded again. It returns the patched object and its operations (decoded, for reports).
func ApplyPatch(obj object.Object, patch []byte) (object.Object, int, error) {
	if len(patch) == 0 {
		return obj, 0, nil
	}
	ops, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		return nil, 0, fmt.Errorf("received undecodable patch in webhook response: %v", err)
	}
	if len(ops) == 0 {
		return obj, 0, nil
	}
	patched, err := ops.Apply(object.Encode(obj))
	if err != nil {
		return nil, len(ops), fmt.Errorf("applying the patch: %v", err)
	}
	out, err := object.Decode(patched)
	if err != nil {
		return nil, len(ops), fmt.Errorf("decoding the patched object: %v", err)
	}
	return out, len(ops), nil
}

// Default is o.GetObjectDefaulter().Default, which the dispatcher runs on the patched object.
func Default(kind Kind, obj object.Object) {
	switch kind {
	case PodKind:
		defaults.Pod(obj)
	case JobKind:
		defaults.Job(obj)
	}
}

// generateName is names.SimpleNameGenerator.GenerateName.
func generateName(prefix string) string {
	return defaults.GenerateName(prefix)
}
