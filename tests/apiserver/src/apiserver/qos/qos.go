// Package qos is k8s.io/kubernetes pkg/apis/core/v1/helper/qos (GetPodQOS): the QoS class
// of a pod from its containers' and init containers' cpu and memory requests and limits.
package qos

import (
	"math/big"

	"apiserver/object"
	"apiserver/quantity"
)

// Pod returns Guaranteed, Burstable or BestEffort.
func Pod(pod object.Object) string {
	spec := object.Map(pod["spec"])
	requests, limits := map[string]*big.Rat{}, map[string]*big.Rat{}
	guaranteed := true
	var containers []object.Object
	containers = append(containers, object.Maps(spec["containers"])...)
	containers = append(containers, object.Maps(spec["initContainers"])...)
	for _, c := range containers {
		res := object.Map(c["resources"])
		for name, v := range object.Map(res["requests"]) {
			if q := supported(name, v); q != nil {
				add(requests, name, q)
			}
		}
		found := map[string]bool{}
		for name, v := range object.Map(res["limits"]) {
			if q := supported(name, v); q != nil {
				found[name] = true
				add(limits, name, q)
			}
		}
		if !found["cpu"] || !found["memory"] {
			guaranteed = false
		}
	}
	if len(requests) == 0 && len(limits) == 0 {
		return "BestEffort"
	}
	if guaranteed {
		for name, r := range requests {
			if l, ok := limits[name]; !ok || l.Cmp(r) != 0 {
				guaranteed = false
				break
			}
		}
	}
	if guaranteed && len(requests) == len(limits) {
		return "Guaranteed"
	}
	return "Burstable"
}

// supported: cpu and memory only, and zero quantities do not count.
func supported(name string, v interface{}) *big.Rat {
	if name != "cpu" && name != "memory" {
		return nil
	}
	q, err := quantity.Parse(v)
	if err != nil || q.Sign() == 0 {
		return nil
	}
	return q
}

func add(m map[string]*big.Rat, name string, q *big.Rat) {
	if old, ok := m[name]; ok {
		m[name] = new(big.Rat).Add(old, q)
	} else {
		m[name] = new(big.Rat).Set(q)
	}
}
