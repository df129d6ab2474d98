package webhookclient

import (
	"encoding/json"
	"errors"
	"fmt"
)

const (
	admissionV1      = "admission.k8s.io/v1"
	admissionV1beta1 = "admission.k8s.io/v1beta1"
	// PatchTypeJSONPatch is admissionv1.PatchTypeJSONPatch.
	PatchTypeJSONPatch = "JSONPatch"
)

// sentReview is what the verification needs of the review that was sent.
type sentReview struct {
	apiVersion string
	uid        string
}

func parseRequest(review []byte) (sentReview, error) {
	var top struct {
		APIVersion string `json:"apiVersion"`
		Request    *struct {
			UID string `json:"uid"`
		} `json:"request"`
	}
	if err := json.Unmarshal(review, &top); err != nil {
		return sentReview{}, fmt.Errorf("the review to send is not JSON: %v", err)
	}
	if top.Request == nil || top.Request.UID == "" {
		return sentReview{}, errors.New("the review to send has no request.uid")
	}
	if top.APIVersion != admissionV1 && top.APIVersion != admissionV1beta1 {
		return sentReview{}, fmt.Errorf("the review to send has apiVersion %q", top.APIVersion)
	}
	return sentReview{apiVersion: top.APIVersion, uid: top.Request.UID}, nil
}

// verify decodes resp.Body into resp's AdmissionResponse fields and checks it as
// VerifyAdmissionResponse (apiserver/pkg/admission/plugin/webhook/request/admissionreview.go)
// does for the version that was sent.
//
// The API server decodes with sigs.k8s.io/json, which matches field names case-sensitively
// (encoding/json does not), so fields are looked up by their exact names here; unknown fields
// are ignored, as there.
func verify(resp *Response, sent sentReview, mutating bool) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(resp.Body, &top); err != nil {
		return fmt.Errorf("the answer is not a JSON object: %v", err)
	}
	var apiVersion, kind string
	if err := field(top, "apiVersion", &apiVersion); err != nil {
		return err
	}
	if err := field(top, "kind", &kind); err != nil {
		return err
	}
	if apiVersion == "" || kind == "" {
		// The codec refuses an object without apiVersion and kind.
		return errors.New("the answer has no apiVersion or kind")
	}
	var body map[string]json.RawMessage
	if err := field(top, "response", &body); err != nil {
		return err
	}
	if body == nil {
		return errors.New("webhook response was absent")
	}
	var patchType *string
	for _, f := range []struct {
		name string
		into interface{}
	}{
		{"uid", &resp.UID},
		{"allowed", &resp.Allowed},
		{"patch", &resp.Patch}, // []byte: base64 in JSON
		{"patchType", &patchType},
		{"status", &resp.Result},
		{"warnings", &resp.Warnings},
		{"auditAnnotations", &resp.AuditAnnotations},
	} {
		if err := field(body, f.name, f.into); err != nil {
			return err
		}
	}

	if sent.apiVersion == admissionV1beta1 {
		// v1beta1: uid, kind and patchType were never verified; a patch is pinned to JSONPatch.
		if !mutating {
			resp.Patch = nil
		} else if len(resp.Patch) > 0 {
			resp.PatchType = PatchTypeJSONPatch
		}
		return nil
	}
	if resp.UID != sent.uid {
		return fmt.Errorf("expected response.uid=%q, got %q", sent.uid, resp.UID)
	}
	if apiVersion != admissionV1 || kind != "AdmissionReview" {
		return fmt.Errorf("expected webhook response of %s, Kind=AdmissionReview, got %s, Kind=%s",
			admissionV1, apiVersion, kind)
	}
	if !mutating {
		if len(resp.Patch) > 0 {
			return errors.New("validating webhook may not return response.patch")
		}
		if patchType != nil {
			return errors.New("validating webhook may not return response.patchType")
		}
		return nil
	}
	if len(resp.Patch) > 0 && patchType == nil {
		return errors.New("webhook returned response.patch but not response.patchType")
	}
	if len(resp.Patch) == 0 && patchType != nil {
		return errors.New("webhook returned response.patchType but not response.patch")
	}
	if patchType != nil {
		if *patchType == "" {
			return fmt.Errorf("webhook returned invalid response.patchType of %q", *patchType)
		}
		resp.PatchType = *patchType
		// The dispatcher then refuses any type but JSONPatch ("unsupported patch type").
		if resp.PatchType != PatchTypeJSONPatch {
			return fmt.Errorf("unsupported patch type %q", resp.PatchType)
		}
	}
	return nil
}

// field decodes obj[name] into into; a missing key or a JSON null leaves into as it is.
func field(obj map[string]json.RawMessage, name string, into interface{}) error {
	raw, ok := obj[name]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("decoding %s: %v", name, err)
	}
	return nil
}
