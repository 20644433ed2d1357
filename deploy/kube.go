package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Object is one Kubernetes object of the base: its kind, name and labels,
// a ConfigMap's data, and its spec, which DecodeSpec reads.
type Object struct {
	File     string `yaml:"-"`
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data    map[string]string `yaml:"data"`
	RawSpec yaml.Node         `yaml:"spec"`
}

// DecodeSpec decodes o's spec into v, a pointer to a struct with yaml tags.
func (o Object) DecodeSpec(v any) error {
	if err := o.RawSpec.Decode(v); err != nil {
		return fmt.Errorf("%s %s: %w", o.File, o.Kind, err)
	}
	return nil
}

// Manifests are the objects of every deploy/*.yaml but the kustomization,
// and the names of those files.
type Manifests struct {
	Objects []Object
	Files   []string
}

// ReadManifests parses every document of every *.yaml in dir but
// kustomization.yaml.
func ReadManifests(dir string) (Manifests, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return Manifests{}, err
	}
	var m Manifests
	for _, file := range files {
		name := filepath.Base(file)
		if name == "kustomization.yaml" {
			continue
		}
		m.Files = append(m.Files, name)
		b, err := os.ReadFile(file)
		if err != nil {
			return Manifests{}, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			o := Object{File: name}
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return Manifests{}, fmt.Errorf("%s: %w", name, err)
			}
			m.Objects = append(m.Objects, o)
		}
	}
	return m, nil
}

// Get returns the object of that kind and name.
func (m Manifests) Get(kind, name string) (Object, error) {
	for _, o := range m.Objects {
		if o.Kind == kind && o.Metadata.Name == name {
			return o, nil
		}
	}
	return Object{}, fmt.Errorf("deploy/ has no %s/%s", kind, name)
}

// LabelSelector is a selector's matchLabels.
type LabelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// Selects reports whether a non-empty selector sel selects labels.
func Selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Deployment is the spec of a Deployment.
type Deployment struct {
	Replicas *int          `yaml:"replicas"`
	Selector LabelSelector `yaml:"selector"`
	Template PodTemplate   `yaml:"template"`
}

// Job is the spec of a Job.
type Job struct {
	Template PodTemplate `yaml:"template"`
}

// PodTemplate is a pod template.
type PodTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               struct {
			RunAsNonRoot *bool  `yaml:"runAsNonRoot"`
			RunAsUser    *int64 `yaml:"runAsUser"`
		} `yaml:"securityContext"`
		Containers []Container `yaml:"containers"`
	} `yaml:"spec"`
}

// Probe is a container probe; only httpGet is read.
type Probe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"`
	} `yaml:"httpGet"`
}

// KeyRef names a key of a Secret or ConfigMap.
type KeyRef struct {
	Name     string `yaml:"name"`
	Key      string `yaml:"key"`
	Optional bool   `yaml:"optional"`
}

// EnvVar is one entry of a container's env.
type EnvVar struct {
	Name      string  `yaml:"name"`
	Value     *string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef    *KeyRef `yaml:"secretKeyRef"`
		ConfigMapKeyRef *KeyRef `yaml:"configMapKeyRef"`
	} `yaml:"valueFrom"`
}

// Container is a container of a pod template.
type Container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env     []EnvVar `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct{ Name string } `yaml:"configMapRef"`
		SecretRef    *struct{ Name string } `yaml:"secretRef"`
	} `yaml:"envFrom"`
	StartupProbe   *Probe `yaml:"startupProbe"`
	ReadinessProbe *Probe `yaml:"readinessProbe"`
	LivenessProbe  *Probe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

// PortByName maps the container's port names to their numbers.
func (c Container) PortByName() map[string]int {
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	return ports
}

// Port resolves a port reference (a number or a port's name) to a number
// of the container; 0 when it names none.
func (c Container) Port(ref yaml.Node) int {
	if p, err := strconv.Atoi(ref.Value); err == nil {
		return p
	}
	return c.PortByName()[ref.Value]
}

// Var is one variable a container gets, and where from: "value",
// "configMapRef" (envFrom), "configMapKeyRef" or "secretKeyRef". A
// Secret's value lives in the cluster, so Value is empty for it.
type Var struct {
	Name, Value, From string
	Optional          bool // a key ref marked optional: true
}

// Environment is the variables c gets from its env and its envFrom
// ConfigMaps, with ConfigMap values looked up in m. It reports a reference
// to a ConfigMap or key that m lacks, a key ref without a name or key, and
// an entry with no value. (An envFrom Secret is left out: it cannot say
// which variables it sets.)
func (m Manifests) Environment(c Container) ([]Var, error) {
	var vars []Var
	var errs []error
	configMap := func(name string) map[string]string {
		o, err := m.Get("ConfigMap", name)
		if err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", c.Name, err))
		}
		return o.Data
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			for k, v := range configMap(ef.ConfigMapRef.Name) {
				vars = append(vars, Var{Name: k, Value: v, From: "configMapRef"})
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			vars = append(vars, Var{Name: e.Name, Value: *e.Value, From: "value"})
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if ref.Name == "" || ref.Key == "" {
				errs = append(errs, fmt.Errorf("container %s: %s's secretKeyRef lacks a name or key", c.Name, e.Name))
			}
			vars = append(vars, Var{Name: e.Name, From: "secretKeyRef", Optional: ref.Optional})
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			v, ok := configMap(ref.Name)[ref.Key]
			if !ok && !ref.Optional {
				errs = append(errs, fmt.Errorf("container %s: %s refers to missing key %s of ConfigMap %s", c.Name, e.Name, ref.Key, ref.Name))
			}
			vars = append(vars, Var{Name: e.Name, Value: v, From: "configMapKeyRef", Optional: ref.Optional})
		default:
			errs = append(errs, fmt.Errorf("container %s: %s has no value", c.Name, e.Name))
		}
	}
	return vars, errors.Join(errs...)
}
