package validation

import (
	"fmt"
	"path"
	"strings"

	"apiserver/object"
)

// Volumes is ValidateVolumes: DNS-1123 label names, no duplicates, exactly one source, and the
// sources modelgate writes (persistentVolumeClaim) or the API server adds (projected) checked.
// It returns the volumes by name for the mount checks.
func Volumes(volumes []object.Object, p string, errs *Errors) map[string]object.Object {
	byName := map[string]object.Object{}
	for i, v := range volumes {
		vp := fmt.Sprintf("%s[%d]", p, i)
		name := object.Str(v["name"])
		if name == "" {
			errs.add(vp+".name", "Required value")
		} else {
			errs.addAll(vp+".name", name, IsDNS1123Label(name))
		}
		if _, dup := byName[name]; dup {
			errs.add(vp+".name", "Duplicate value: %q", name)
		}
		byName[name] = v
		sources := 0
		for k := range v {
			if k != "name" {
				sources++
			}
		}
		if sources == 0 {
			errs.add(vp, "Required value: must specify a volume type")
		} else if sources > 1 {
			errs.add(vp, "Forbidden: may not specify more than 1 volume type")
		}
		if pvc := object.Map(v["persistentVolumeClaim"]); pvc != nil {
			if claim := object.Str(pvc["claimName"]); claim == "" {
				errs.add(vp+".persistentVolumeClaim.claimName", "Required value")
			} else {
				errs.addAll(vp+".persistentVolumeClaim.claimName", claim, IsDNS1123Subdomain(claim))
			}
		}
		if proj := object.Map(v["projected"]); proj != nil {
			for j, s := range object.Maps(proj["sources"]) {
				if t := object.Map(s["serviceAccountToken"]); t != nil {
					if secs, _ := object.Int(t["expirationSeconds"]); secs < 600 || secs > 1<<32 {
						errs.add(fmt.Sprintf("%s.projected.sources[%d].serviceAccountToken.expirationSeconds", vp, j), "Invalid value: %d: may not be less than 10 minutes or longer than 2^32 seconds", secs)
					}
				}
			}
		}
	}
	return byName
}

// VolumeMounts is ValidateVolumeMounts: the volume must exist, mountPath is required and
// unique within the container, subPath is a relative path without '..', subPath and
// subPathExpr exclude each other.
func VolumeMounts(mounts []object.Object, volumes map[string]object.Object, p string, errs *Errors) {
	paths := map[string]bool{}
	for i, m := range mounts {
		mp := fmt.Sprintf("%s[%d]", p, i)
		name := object.Str(m["name"])
		if name == "" {
			errs.add(mp+".name", "Required value")
		} else if _, ok := volumes[name]; !ok {
			errs.add(mp+".name", "Not found: %q", name)
		}
		mountPath := object.Str(m["mountPath"])
		if mountPath == "" {
			errs.add(mp+".mountPath", "Required value")
		}
		if paths[mountPath] {
			errs.add(mp+".mountPath", "Invalid value: %q: must be unique", mountPath)
		}
		paths[mountPath] = true
		if sub := object.Str(m["subPath"]); sub != "" {
			localPath(sub, mp+".subPath", errs)
			if object.Str(m["subPathExpr"]) != "" {
				errs.add(mp+".subPathExpr", "Invalid value: subPathExpr and subPath are mutually exclusive")
			}
		}
		if _, ok := m["readOnly"]; ok {
			if _, isBool := object.Bool(m["readOnly"]); !isBool {
				errs.add(mp+".readOnly", "Invalid value: must be a boolean")
			}
		}
	}
}

// localPath is validateLocalDescendingPath.
func localPath(p, fp string, errs *Errors) {
	if path.IsAbs(p) {
		errs.add(fp, "Invalid value: %q: must be a relative path", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			errs.add(fp, "Invalid value: %q: must not contain '..'", p)
			break
		}
	}
}
