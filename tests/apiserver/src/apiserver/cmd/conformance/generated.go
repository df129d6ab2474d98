package main

import (
	"fmt"
	"os"

	"apiserver/admission"
	"apiserver/object"
)

// The generated cluster state: for each N, a LocalModelNodeGroup whose PV nodeAffinity selects
// N Nodes, a LocalModelCache downloaded on all N of them, and the PVC `<cache>-<group>` in the
// harness's namespace. Node names differ from their kubernetes.io/hostname labels, as on most
// clouds, so that a pin by the wrong one shows.
const generatedNamespace = "conformance"

var nodeCounts = []int{1, 2, 50}

const groupLabel = "conformance.modelgate.io/group"

func cacheName(n int) string { return fmt.Sprintf("conf-model-%d", n) }
func modelURI(n int) string  { return fmt.Sprintf("hf://conformance/model-%d", n) }

// writeClusterState writes the generated state as a YAML stream of JSON documents.
func writeClusterState(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, n := range nodeCounts {
		group := fmt.Sprintf("conf-group-%d", n)
		docs := []object.Object{
			{"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNodeGroup",
				"metadata": object.Object{"name": group},
				"spec": object.Object{"storageLimit": "100Gi", "persistentVolumeSpec": object.Object{
					"accessModes": []interface{}{"ReadWriteOnce"}, "capacity": object.Object{"storage": "100Gi"},
					"local": object.Object{"path": "/mnt/models"}, "storageClassName": "local-storage",
					"nodeAffinity": object.Object{"required": object.Object{"nodeSelectorTerms": []interface{}{
						object.Object{"matchExpressions": []interface{}{object.Object{"key": groupLabel, "operator": "In", "values": []interface{}{group}}}},
					}}},
				}}},
			{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
				"metadata": object.Object{"name": cacheName(n) + "-" + group, "namespace": generatedNamespace},
				"spec":     object.Object{"accessModes": []interface{}{"ReadWriteOnce"}, "resources": object.Object{"requests": object.Object{"storage": "100Gi"}}},
				"status":   object.Object{"phase": "Bound"}},
		}
		nodeStatus := object.Object{}
		for i := 1; i <= n; i++ {
			node := fmt.Sprintf("conf-%d-node-%d", n, i)
			nodeStatus[node] = "NodeDownloaded"
			docs = append(docs, object.Object{"apiVersion": "v1", "kind": "Node", "metadata": object.Object{
				"name": node,
				"labels": object.Object{groupLabel: group, "kubernetes.io/os": "linux",
					"kubernetes.io/hostname": fmt.Sprintf("ip-10-%d-0-%d.ec2.internal", n, i)},
			}})
		}
		docs = append(docs, object.Object{"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
			"metadata": object.Object{"name": cacheName(n)},
			"spec":     object.Object{"sourceModelUri": modelURI(n), "modelSize": "10Gi", "nodeGroups": []interface{}{group}},
			"status":   object.Object{"nodeStatus": nodeStatus, "copies": object.Object{"available": object.Num(int64(n)), "total": object.Num(int64(n))}}})
		for _, d := range docs {
			fmt.Fprintf(f, "---\n%s\n", object.Encode(d))
		}
	}
	return nil
}

// generatedCases are Pods and Jobs that hit each generated cache, with and without a writable
// model-cache volume, made by a user or (generateName, owner) by a controller, with a required
// node affinity of their own, and Guaranteed ones; plus a miss with a cache volume.
func generatedCases() []testCase {
	var cases []testCase
	for _, n := range nodeCounts {
		expect := "cluster/" + cacheName(n)
		for _, cache := range []bool{false, true} {
			suffix := ""
			if cache {
				suffix = "-cache"
			}
			name := fmt.Sprintf("hit-%d%s", n, suffix)
			cases = append(cases,
				podCase(name+"-pod", pod(name, modelURI(n), cache, false), expect),
				jobCase(name+"-job", job(name, modelURI(n), cache, false), expect),
			)
			controllerMade := pod("", modelURI(n), cache, false)
			meta := object.Map(controllerMade["metadata"])
			meta["generateName"] = name + "-7d9f8-"
			meta["ownerReferences"] = []interface{}{object.Object{"apiVersion": "apps/v1", "kind": "ReplicaSet",
				"name": name + "-7d9f8", "uid": admission.NewUID(), "controller": true, "blockOwnerDeletion": true}}
			c := podCase(name+"-pod-generatename", controllerMade, expect)
			c.User = admission.ReplicaSetController
			cases = append(cases, c)
			withAffinity := pod(name+"-affinity", modelURI(n), cache, false)
			object.Map(withAffinity["spec"])["affinity"] = object.Object{"nodeAffinity": object.Object{
				"requiredDuringSchedulingIgnoredDuringExecution": object.Object{"nodeSelectorTerms": []interface{}{
					object.Object{"matchExpressions": []interface{}{object.Object{"key": "topology.kubernetes.io/zone", "operator": "In", "values": []interface{}{"us-east-1a", "us-east-1b"}}}},
					object.Object{"matchExpressions": []interface{}{object.Object{"key": "node.kubernetes.io/instance-type", "operator": "Exists"}}},
				}}}}
			cases = append(cases, podCase(name+"-pod-own-affinity", withAffinity, expect))
		}
		g := podCase(fmt.Sprintf("guaranteed-hit-%d-cache-pod", n), pod(fmt.Sprintf("guaranteed-%d", n), modelURI(n), true, true), expect)
		g.Guaranteed = true
		gj := jobCase(fmt.Sprintf("guaranteed-hit-%d-cache-job", n), job(fmt.Sprintf("guaranteed-%d", n), modelURI(n), true, true), expect)
		gj.Guaranteed = true
		cases = append(cases, g, gj)
	}
	cases = append(cases,
		podCase("miss-cache-pod", pod("miss", "hf://conformance/not-cached", true, false), "miss"),
		jobCase("miss-cache-job", job("miss", "hf://conformance/not-cached", true, false), "miss"),
	)
	return cases
}

func podCase(name string, o object.Object, expect string) testCase {
	return testCase{Name: "generated/" + name, Group: "generated", Kind: admission.PodKind, Object: o,
		Namespace: generatedNamespace, User: admission.Admin, ExpectCache: expect}
}

func jobCase(name string, o object.Object, expect string) testCase {
	return testCase{Name: "generated/" + name, Group: "generated", Kind: admission.JobKind, Object: o,
		Namespace: generatedNamespace, User: admission.Admin, ExpectCache: expect}
}

// podSpec is a vLLM-like server: a GPU container that reads the model from /mnt/models and,
// with cache, writes to a model-cache PVC at /models. guaranteed: cpu and memory requests
// equal to limits.
func podSpec(name string, cache, guaranteed bool) object.Object {
	resources := object.Object{"limits": object.Object{"nvidia.com/gpu": "1"}}
	if guaranteed {
		resources = object.Object{
			"requests": object.Object{"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
			"limits":   object.Object{"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
		}
	}
	container := object.Object{
		"name": "server", "image": "docker.io/vllm/vllm-openai:v0.6.3",
		"args":      []interface{}{"--model", "/mnt/models", "--port", "8000"},
		"ports":     []interface{}{object.Object{"containerPort": object.Num(8000)}},
		"resources": resources,
	}
	spec := object.Object{"containers": []interface{}{container}}
	if cache {
		container["volumeMounts"] = []interface{}{object.Object{"name": "model-cache", "mountPath": "/models"}}
		spec["volumes"] = []interface{}{object.Object{"name": "model-cache",
			"persistentVolumeClaim": object.Object{"claimName": name + "-scratch"}}}
	}
	return spec
}

func pod(name, uri string, cache, guaranteed bool) object.Object {
	meta := object.Object{"labels": object.Object{"app": "llm"}, "annotations": object.Object{"modelgate.io/model-uri": uri}}
	if name != "" {
		meta["name"] = name
	}
	specName := name
	if specName == "" {
		specName = "controller-made"
	}
	return object.Object{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": podSpec(specName, cache, guaranteed)}
}

func job(name, uri string, cache, guaranteed bool) object.Object {
	spec := podSpec(name, cache, guaranteed)
	spec["restartPolicy"] = "Never"
	if cache {
		// A Job's pods cannot share one RWO claim: each gets its own (an ephemeral volume).
		spec["volumes"] = []interface{}{object.Object{"name": "model-cache", "ephemeral": object.Object{
			"volumeClaimTemplate": object.Object{"spec": object.Object{
				"accessModes": []interface{}{"ReadWriteOnce"},
				"resources":   object.Object{"requests": object.Object{"storage": "50Gi"}},
			}}}}}
	}
	return object.Object{"apiVersion": "batch/v1", "kind": "Job",
		"metadata": object.Object{"name": name},
		"spec": object.Object{"backoffLimit": object.Num(2), "template": object.Object{
			"metadata": object.Object{"labels": object.Object{"app": "llm-batch"}, "annotations": object.Object{"modelgate.io/model-uri": uri}},
			"spec":     spec,
		}}}
}
