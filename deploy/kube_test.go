package deploy_test

// The Kubernetes base's rules among its own objects: selectors, security,
// scaling, the kustomization. cmd/munchable-webhooks/deploy_test.go checks
// the containers' environment, ports, probes and grace period against the
// configuration.

import (
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/munchable/munchable-webhooks/deploy"
)

func manifests(t *testing.T) deploy.Manifests {
	t.Helper()
	m, err := deploy.ReadManifests(filepath.Join(root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// spec decodes the spec of the object kind/name into a T.
func spec[T any](t *testing.T, m deploy.Manifests, kind, name string) T {
	t.Helper()
	var v T
	o, err := m.Get(kind, name)
	if err == nil {
		err = o.DecodeSpec(&v)
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// kustomization is what deploy/kustomization.yaml lists and pins.
type kustomization struct {
	Resources []string `yaml:"resources"`
	Images    []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
	} `yaml:"images"`
}

func readKustomization(t *testing.T) kustomization {
	t.Helper()
	var k kustomization
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKustomization(t *testing.T) {
	t.Parallel()
	k := readKustomization(t)
	got, want := slices.Sorted(slices.Values(k.Resources)), slices.Sorted(slices.Values(manifests(t).Files))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kustomization resources vs deploy/*.yaml (-files +listed):\n%s", diff)
	}
	if len(k.Images) != 1 || k.Images[0].Name != "munchable-webhooks" {
		t.Fatalf("kustomization images = %+v, want the one image name the manifests use", k.Images)
	}
	// The manifests name the image without a tag (checkPod); the tag is
	// pinned here, once, to what the release workflow pushes for a tag
	// vX.Y.Z (docs/OPERATIONS.md, Releasing).
	if img := k.Images[0]; img.NewName != "ghcr.io/munchable/munchable-webhooks" || !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(img.NewTag) {
		t.Errorf("kustomization pins %s:%s, want ghcr.io/munchable/munchable-webhooks:X.Y.Z, a released version", img.NewName, img.NewTag)
	}
}

// deployment is the Deployment's spec and the labels of its pods.
func deployment(t *testing.T, m deploy.Manifests) (deploy.Deployment, map[string]string) {
	t.Helper()
	d := spec[deploy.Deployment](t, m, "Deployment", "munchable-webhooks")
	return d, d.Template.Metadata.Labels
}

// Secrets are referenced by name, never held; each object is defined once.
func TestManifestObjects(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, o := range manifests(t).Objects {
		if o.Kind == "Secret" {
			t.Errorf("%s holds a Secret: secrets are referenced by name only", o.File)
		}
		if key := o.Kind + "/" + o.Metadata.Name; seen[key] {
			t.Errorf("%s defined twice", key)
		} else {
			seen[key] = true
		}
	}
}

func TestDeployment(t *testing.T) {
	t.Parallel()
	d, pods := deployment(t, manifests(t))
	// The HPA owns the count: a replicas field would reset it on every apply.
	if d.Replicas != nil {
		t.Errorf("deployment sets replicas: %d, while hpa.yaml scales it", *d.Replicas)
	}
	if !deploy.Selects(d.Selector.MatchLabels, pods) {
		t.Errorf("deployment selector %v does not select its pods %v", d.Selector.MatchLabels, pods)
	}
	checkPod(t, d.Template)
	c := d.Template.Spec.Containers[0]
	if !cmp.Equal(c.Args, []string{"serve"}) {
		t.Errorf("deployment args = %v, want [serve]", c.Args)
	}
	if c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Error("no preStop sleep: SIGTERM would close the listener while endpoints still route to the pod")
	}
	if d.Template.Spec.TerminationGracePeriodSeconds == nil {
		t.Error("no terminationGracePeriodSeconds (the default 30 s is under HANDLER_TIMEOUT plus the pause)")
	}
}

type service struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []struct {
		TargetPort yaml.Node `yaml:"targetPort"`
	} `yaml:"ports"`
}

type pdb struct {
	MinAvailable   *int                 `yaml:"minAvailable"`
	MaxUnavailable *int                 `yaml:"maxUnavailable"`
	Selector       deploy.LabelSelector `yaml:"selector"`
}

// The load balancer's way in reaches the pods' http port, never metrics.
func TestService(t *testing.T) {
	t.Parallel()
	m := manifests(t)
	d, pods := deployment(t, m)
	svc := spec[service](t, m, "Service", "munchable-webhooks")
	if !deploy.Selects(svc.Selector, pods) {
		t.Errorf("service selector %v does not select the pods %v", svc.Selector, pods)
	}
	c := d.Template.Spec.Containers[0]
	http, metrics := c.PortByName()["http"], c.PortByName()["metrics"]
	for _, p := range svc.Ports {
		switch c.Port(p.TargetPort) {
		case http:
		case metrics:
			t.Errorf("service exposes the metrics port (targetPort %q) to the load balancer", p.TargetPort.Value)
		default:
			t.Errorf("service targetPort %q is not the container port http (%d)", p.TargetPort.Value, http)
		}
	}
}

func TestPodDisruptionBudget(t *testing.T) {
	t.Parallel()
	m := manifests(t)
	_, pods := deployment(t, m)
	b := spec[pdb](t, m, "PodDisruptionBudget", "munchable-webhooks")
	if !deploy.Selects(b.Selector.MatchLabels, pods) {
		t.Errorf("PDB selector %v does not select the pods", b.Selector.MatchLabels)
	}
	if !(b.MinAvailable != nil && *b.MinAvailable == 2 && b.MaxUnavailable == nil) &&
		!(b.MaxUnavailable != nil && *b.MaxUnavailable == 1 && b.MinAvailable == nil) {
		t.Errorf("PDB = %+v, want minAvailable 2 or maxUnavailable 1", b)
	}
}

func TestHorizontalPodAutoscaler(t *testing.T) {
	t.Parallel()
	hpa := spec[struct {
		ScaleTargetRef struct{ Kind, Name string } `yaml:"scaleTargetRef"`
		MinReplicas    int                         `yaml:"minReplicas"`
		MaxReplicas    int                         `yaml:"maxReplicas"`
		Metrics        []struct {
			Resource struct{ Name string } `yaml:"resource"`
		} `yaml:"metrics"`
	}](t, manifests(t), "HorizontalPodAutoscaler", "munchable-webhooks")
	if hpa.ScaleTargetRef.Kind != "Deployment" || hpa.ScaleTargetRef.Name != "munchable-webhooks" {
		t.Errorf("HPA scales %+v", hpa.ScaleTargetRef)
	}
	// With the PDB's one pod down, at least two keep serving.
	if hpa.MinReplicas < 3 || hpa.MaxReplicas < hpa.MinReplicas {
		t.Errorf("HPA replicas %d..%d, want a floor of at least 3", hpa.MinReplicas, hpa.MaxReplicas)
	}
	if len(hpa.Metrics) != 1 || hpa.Metrics[0].Resource.Name != "cpu" {
		t.Errorf("HPA metrics %+v, want CPU", hpa.Metrics)
	}
}

// The migration Job runs migrate, and neither the Service nor the PDB
// counts its pod as one of the service's.
func TestMigrationJob(t *testing.T) {
	t.Parallel()
	m := manifests(t)
	job := spec[deploy.Job](t, m, "Job", "munchable-webhooks-migrate")
	checkPod(t, job.Template)
	svc := spec[service](t, m, "Service", "munchable-webhooks")
	b := spec[pdb](t, m, "PodDisruptionBudget", "munchable-webhooks")
	if labels := job.Template.Metadata.Labels; deploy.Selects(svc.Selector, labels) || deploy.Selects(b.Selector.MatchLabels, labels) {
		t.Error("the Service or the PDB selects the migration job's pod")
	}
	if c := job.Template.Spec.Containers[0]; !cmp.Equal(c.Args, []string{"migrate"}) {
		t.Errorf("migration job runs %v, want migrate", c.Args)
	}
}

// checkPod checks a pod template's one container and its security: non-root
// by number, no privilege escalation, a read-only root, no capabilities,
// requests and limits, secrets by key, and the image name kustomize pins.
func checkPod(t *testing.T, pod deploy.PodTemplate) {
	t.Helper()
	sc := pod.Spec.SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		// A numeric user: the image's USER is a name the kubelet cannot check.
		t.Errorf("pod securityContext %+v, want runAsNonRoot and a numeric non-root runAsUser", sc)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	csc := c.SecurityContext
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
		!cmp.Equal(csc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("container %s: securityContext %+v, want no privilege escalation, a read-only root and all capabilities dropped", c.Name, csc)
	}
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" || c.Resources.Limits[r] == "" {
			t.Errorf("container %s: want requests and limits for %s", c.Name, r)
		}
	}
	if c.Image != "munchable-webhooks" {
		t.Errorf("container %s: image %q, want the name kustomization.yaml rewrites", c.Name, c.Image)
	}
	for _, ef := range c.EnvFrom {
		if ef.SecretRef != nil {
			t.Errorf("container %s: envFrom a Secret hides which secrets it needs; use secretKeyRef", c.Name)
		}
	}
}
