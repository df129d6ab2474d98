package defaults

import "apiserver/object"

// Volume is SetDefaults_Volume and the generated defaults of each volume source
// (pkg/apis/core/v1/defaults.go, zz_generated.defaults.go).
func Volume(v object.Object) {
	sources := 0
	for key := range v {
		if key != "name" {
			sources++
		}
	}
	if sources == 0 {
		v["emptyDir"] = object.Object{}
	}
	for _, key := range []string{"secret", "configMap", "downwardAPI", "projected"} {
		if src := object.Map(v[key]); src != nil {
			object.SetDefault(src, "defaultMode", object.Num(0o644))
		}
	}
	if src := object.Map(v["downwardAPI"]); src != nil {
		fieldRefs(src["items"])
	}
	if src := object.Map(v["projected"]); src != nil {
		for _, p := range object.Maps(src["sources"]) {
			if d := object.Map(p["downwardAPI"]); d != nil {
				fieldRefs(d["items"])
			}
			if t := object.Map(p["serviceAccountToken"]); t != nil {
				object.SetDefault(t, "expirationSeconds", object.Num(3600))
			}
		}
	}
	if src := object.Map(v["hostPath"]); src != nil {
		object.SetDefault(src, "type", "")
	}
	if src := object.Map(v["iscsi"]); src != nil {
		object.SetDefault(src, "iscsiInterface", "default")
	}
	if src := object.Map(v["rbd"]); src != nil {
		object.SetDefault(src, "pool", "rbd")
		object.SetDefault(src, "user", "admin")
		object.SetDefault(src, "keyring", "/etc/ceph/keyring")
	}
	if src := object.Map(v["azureDisk"]); src != nil {
		object.SetDefault(src, "cachingMode", "ReadWrite")
		object.SetDefault(src, "fsType", "ext4")
		object.SetDefault(src, "readOnly", false)
		object.SetDefault(src, "kind", "Shared")
	}
	if src := object.Map(v["scaleIO"]); src != nil {
		object.SetDefault(src, "storageMode", "ThinProvisioned")
		object.SetDefault(src, "fsType", "xfs")
	}
	if spec := object.Map(object.Get(v, "ephemeral", "volumeClaimTemplate", "spec")); spec != nil {
		object.SetDefault(spec, "volumeMode", "Filesystem")
	}
}

func fieldRefs(items interface{}) {
	for _, item := range object.Maps(items) {
		if ref := object.Map(item["fieldRef"]); ref != nil {
			object.SetDefault(ref, "apiVersion", "v1")
		}
	}
}
