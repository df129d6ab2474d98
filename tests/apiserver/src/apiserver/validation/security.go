package validation

import (
	"apiserver/object"
)

const maxID = 2147483647

// PodSecurityContext is ValidatePodSecurityContext's id ranges and seccomp profile.
func PodSecurityContext(sc object.Object, p string, errs *Errors) {
	if sc == nil {
		return
	}
	for _, key := range []string{"runAsUser", "runAsGroup", "fsGroup"} {
		idRange(sc, key, p, errs)
	}
	for i, g := range object.Slice(sc["supplementalGroups"]) {
		if n, ok := object.Int(g); !ok || n < 0 || n > maxID {
			errs.add(p+".supplementalGroups["+itoa(i)+"]", "Invalid value: %v: must be between 0 and 2147483647, inclusive", g)
		}
	}
	seccomp(object.Map(sc["seccompProfile"]), p+".seccompProfile", errs)
}

// ContainerSecurityContext is ValidateSecurityContext: id ranges, and allowPrivilegeEscalation
// false is incompatible with privileged and with CAP_SYS_ADMIN.
func ContainerSecurityContext(sc object.Object, p string, errs *Errors) {
	if sc == nil {
		return
	}
	idRange(sc, "runAsUser", p, errs)
	idRange(sc, "runAsGroup", p, errs)
	if ape, ok := object.Bool(sc["allowPrivilegeEscalation"]); ok && !ape {
		if priv, _ := object.Bool(sc["privileged"]); priv {
			errs.add(p, "Invalid value: cannot set `allowPrivilegeEscalation` to false and `privileged` to true")
		}
		for _, c := range object.Slice(object.Get(sc, "capabilities", "add")) {
			if object.Str(c) == "CAP_SYS_ADMIN" || object.Str(c) == "SYS_ADMIN" {
				errs.add(p, "Invalid value: cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN")
			}
		}
	}
	seccomp(object.Map(sc["seccompProfile"]), p+".seccompProfile", errs)
}

func idRange(sc object.Object, key, p string, errs *Errors) {
	v, ok := sc[key]
	if !ok || v == nil {
		return
	}
	if n, isInt := object.Int(v); !isInt || n < 0 || n > maxID {
		errs.add(p+"."+key, "Invalid value: %v: must be between 0 and 2147483647, inclusive", v)
	}
}

// seccomp is validateSeccompProfileField.
func seccomp(profile object.Object, p string, errs *Errors) {
	if profile == nil {
		return
	}
	switch t := object.Str(profile["type"]); t {
	case "RuntimeDefault", "Unconfined":
		if _, ok := profile["localhostProfile"]; ok {
			errs.add(p+".localhostProfile", "Invalid value: can only be set if type is Localhost")
		}
	case "Localhost":
		if object.Str(profile["localhostProfile"]) == "" {
			errs.add(p+".localhostProfile", "Required value: must be set when seccomp type is Localhost")
		}
	default:
		errs.add(p+".type", "Unsupported value: %q", t)
	}
}

func itoa(i int) string {
	return object.Num(int64(i)).String()
}
