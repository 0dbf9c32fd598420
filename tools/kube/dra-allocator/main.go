// dra-allocator runs Kubernetes' own DRA allocator, the package kube-scheduler's
// DynamicResources plugin calls (k8s.io/dynamic-resource-allocation/structured), on what the
// DRA tests give it, so that the tests write into a claim's status what the scheduler would
// write, not what a test author thinks it would. A package of the module tools/kube, so that
// the allocator and every library it calls are the versions Kubernetes 1.36.3 builds
// kube-scheduler with (go.mod pins k8s.io/kubernetes and its staging modules). Built by
// scripts/fetch-dra-allocator; tests/support/allocator.rs runs it.
//
// stdin, one JSON object (objects as the API server serves them):
//
//	{"node": "node-a", "nodeLabels": {...},              // the node the pod is placed on
//	 "resourceSlices": [...], "deviceClasses": [...],
//	 "deviceClassManifests": ["k8s/dra.yaml"],            // YAML files: their DeviceClasses too
//	 "allocatedClaims": [...],                            // claims allocated already (in use)
//	 "claims": [...]}                                     // to allocate, in this order
//
// stdout, one JSON object: {"allocator": "<Go type of the allocator picked>", "features":
// {...}, "results": [one per claim: {"allocation": <status.allocation>} or {"unschedulable":
// "<why>"} or {"error": "<the allocator's error>"}]}. Claims are allocated one after another,
// each in its own scheduling cycle, and a claim allocated here is in use for every later one,
// as the scheduler's allocated-state tracker counts it.
//
// Exit status 2 with one line on stderr: input that could not be read.
//
// `dra-allocator version` prints what it was built from: the k8s.io/dynamic-resource-allocation
// module it links (from the binary's build information), and the sha256 of this file, go.mod
// and go.sum (set by fetch-dra-allocator's -ldflags), by which tests/support/allocator.rs
// tells a binary built from other sources or other pins.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

type input struct {
	Node            string                       `json:"node"`
	NodeLabels      map[string]string            `json:"nodeLabels"`
	ResourceSlices  []*resourceapi.ResourceSlice `json:"resourceSlices"`
	DeviceClasses   []*resourceapi.DeviceClass   `json:"deviceClasses"`
	ClassManifests  []string                     `json:"deviceClassManifests"`
	AllocatedClaims []*resourceapi.ResourceClaim `json:"allocatedClaims"`
	Claims          []*resourceapi.ResourceClaim `json:"claims"`
}

type result struct {
	Allocation    *resourceapi.AllocationResult `json:"allocation,omitempty"`
	Unschedulable string                        `json:"unschedulable,omitempty"`
	Error         string                        `json:"error,omitempty"`
}

type output struct {
	Allocator string              `json:"allocator"`
	Features  structured.Features `json:"features"`
	Results   []result            `json:"results"`
}

// features136 is what kube-scheduler 1.36 passes the allocator with its default feature
// gates (AllocatorFeatures in pkg/scheduler/framework/plugins/dynamicresources): DRAAdminAccess
// (GA), DRAPrioritizedList (GA), DRAPartitionableDevices (beta, on), DRADeviceTaints (beta,
// on), DRADeviceBindingConditions (beta, on) with DRAResourceClaimDeviceStatus (beta, on),
// DRAConsumableCapacity (beta, on). DRAListTypeAttributes is alpha and off.
var features136 = structured.Features{
	AdminAccess:            true,
	PrioritizedList:        true,
	PartitionableDevices:   true,
	DeviceTaints:           true,
	DeviceBindingAndStatus: true,
	ConsumableCapacity:     true,
}

type classLister map[string]*resourceapi.DeviceClass

func (c classLister) List() ([]*resourceapi.DeviceClass, error) {
	classes := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		classes = append(classes, class)
	}
	return classes, nil
}

func (c classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

// allocatedState is what the scheduler's tracker gathers from allocated claims
// (GatherAllocatedState with DRAConsumableCapacity on): a result with a share ID is one share
// of a device, counted with its consumed capacity; any other result takes its device whole;
// a result with admin access takes nothing.
func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if ptr.Deref(r.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

// allocate is one scheduling cycle of one claim on the node: the plugin's PreFilter (device
// classes must exist; a new allocator over the current state), Filter (Allocate), and
// bindClaim's allocation timestamp.
func allocate(ctx context.Context, in *input, classes classLister, node *v1.Node, allocated []*resourceapi.ResourceClaim, claim *resourceapi.ResourceClaim) (result, string) {
	for _, request := range claim.Spec.Devices.Requests {
		names := []string{}
		if request.Exactly != nil {
			names = append(names, request.Exactly.DeviceClassName)
		}
		for _, sub := range request.FirstAvailable {
			names = append(names, sub.DeviceClassName)
		}
		for _, name := range names {
			if _, err := classes.Get(name); err != nil {
				return result{Unschedulable: fmt.Sprintf("request %s: device class %s does not exist", request.Name, name)}, ""
			}
		}
	}
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: features136.ConsumableCapacity})
	allocator, err := structured.NewAllocator(ctx, features136, allocatedState(allocated), classes, in.ResourceSlices, cache)
	if err != nil {
		return result{Error: err.Error()}, ""
	}
	picked := fmt.Sprintf("%T", allocator)
	allocations, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
	switch {
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		return result{Unschedulable: err.Error()}, picked
	case err != nil:
		return result{Error: err.Error()}, picked
	case len(allocations) != 1:
		return result{Unschedulable: "cannot allocate all claims"}, picked
	}
	allocation := allocations[0]
	if features136.DeviceBindingAndStatus {
		allocation.AllocationTimestamp = &metav1.Time{Time: time.Now().Truncate(time.Second)}
	}
	return result{Allocation: &allocation}, picked
}

// manifestClasses reads the DeviceClasses of a YAML manifest (several documents, as
// kubectl apply -f takes them); the other kinds are passed over.
func manifestClasses(path string) ([]*resourceapi.DeviceClass, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	decoder := yaml.NewYAMLOrJSONDecoder(file, 4096)
	var classes []*resourceapi.DeviceClass
	for document := 1; ; document++ {
		var object map[string]interface{}
		if err := decoder.Decode(&object); err == io.EOF {
			return classes, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, document, err)
		}
		if object["kind"] != "DeviceClass" {
			continue
		}
		text, err := json.Marshal(object)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, document, err)
		}
		class := &resourceapi.DeviceClass{}
		strict := json.NewDecoder(bytes.NewReader(text))
		strict.DisallowUnknownFields()
		if err := strict.Decode(class); err != nil {
			return nil, fmt.Errorf("%s: document %d (DeviceClass): %w", path, document, err)
		}
		classes = append(classes, class)
	}
}

func run() error {
	var in input
	decoder := json.NewDecoder(os.Stdin)
	// A field the Go types do not know would be dropped silently and the allocator would
	// decide on less than the test gave it.
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&in); err != nil {
		return fmt.Errorf("reading the input on stdin: %w", err)
	}
	if in.Node == "" {
		return errors.New("the input names no node (\"node\")")
	}
	for _, path := range in.ClassManifests {
		found, err := manifestClasses(path)
		if err != nil {
			return err
		}
		in.DeviceClasses = append(in.DeviceClasses, found...)
	}
	classes := classLister{}
	for _, class := range in.DeviceClasses {
		classes[class.Name] = class
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: in.Node, Labels: in.NodeLabels}}
	out := output{Features: features136, Results: []result{}}
	allocated := append([]*resourceapi.ResourceClaim{}, in.AllocatedClaims...)
	ctx := context.Background()
	for _, claim := range in.Claims {
		if claim.Status.Allocation != nil {
			return fmt.Errorf("claim %s/%s is allocated already; list it in allocatedClaims", claim.Namespace, claim.Name)
		}
		r, picked := allocate(ctx, &in, classes, node, allocated, claim)
		if picked != "" {
			out.Allocator = picked
		}
		out.Results = append(out.Results, r)
		if r.Allocation != nil {
			done := claim.DeepCopy()
			done.Status.Allocation = r.Allocation
			allocated = append(allocated, done)
		}
	}
	encoder := json.NewEncoder(os.Stdout)
	return encoder.Encode(out)
}

// Set at build time (-ldflags -X) by scripts/fetch-dra-allocator: the sha256 of the files
// the binary is built from.
var (
	sourceSHA256 = "unknown"
	goModSHA256  = "unknown"
	goSumSHA256  = "unknown"
)

// allocatorModule is the k8s.io/dynamic-resource-allocation the binary links, as
// "<path> <version>": the version go.mod's replace gives it (the staging module's tag), read
// from the build information Go writes into every binary built in module mode.
func allocatorModule() string {
	const path = "k8s.io/dynamic-resource-allocation"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return path + " unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path != path {
			continue
		}
		if dep.Replace != nil {
			return dep.Replace.Path + " " + dep.Replace.Version
		}
		return dep.Path + " " + dep.Version
	}
	return path + " not linked"
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Printf("%s\nsource %s main.go\nsource %s go.mod\nsource %s go.sum\n", allocatorModule(), sourceSHA256, goModSHA256, goSumSHA256)
		return
	}
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "dra-allocator: unknown arguments %q; it reads its input on stdin, or prints its build with `version`\n", os.Args[1:])
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "dra-allocator: %v\n", err)
		os.Exit(2)
	}
}
