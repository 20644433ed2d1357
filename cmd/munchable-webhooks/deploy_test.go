package main

// The deploy files against the configuration, which only package main can
// see: which variables config.go reads, which are secrets and which are
// required, and the ports and timeouts they parse to. The files' rules
// among themselves are deploy/'s tests; the metrics the alerts and the
// dashboard read are checked by internal/faulttest, which scrapes the
// binary.

import (
	"encoding/base64"
	"maps"
	"net"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/deploy"
)

const repoRoot = "../.."

// envNames returns the env tags of T's fields, those of embedded
// structs (ClaimConfig) included.
func envNames[T any]() map[string]bool {
	names := map[string]bool{}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[T]()) {
		if n := f.Tag.Get("env"); n != "" {
			names[n] = true
		}
	}
	return names
}

// secretNames returns the variables T holds as secrets: they must never be
// set from a ConfigMap or a literal in a manifest.
func secretNames[T any]() map[string]bool {
	names := map[string]bool{}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[T]()) {
		if f.Type == reflect.TypeFor[secret]() {
			names[f.Tag.Get("env")] = true
		}
	}
	return names
}

// requiredNames returns the variables whose absence validate reports as
// "X is required", by validating an empty environment.
func requiredNames(t *testing.T, load func([]string) error) []string {
	t.Helper()
	err := load(nil)
	if err == nil {
		t.Fatal("an empty environment is valid: nothing is required?")
	}
	var names []string
	for line := range strings.SplitSeq(err.Error(), "\n") {
		if name, _, ok := strings.Cut(line, " is required"); ok && !strings.Contains(name, " ") {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("no \"X is required\" line in %q", err)
	}
	return names
}

func requiredServeVars(t *testing.T) []string {
	return requiredNames(t, func(env []string) error { _, err := loadConfig(env); return err })
}

func requiredMigrateVars(t *testing.T) []string {
	return requiredNames(t, func(env []string) error { _, err := loadMigrateConfig(env); return err })
}

func listenPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	return port
}

func manifests(t *testing.T) deploy.Manifests {
	t.Helper()
	m, err := deploy.ReadManifests(filepath.Join(repoRoot, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// podTemplate is the pod template of the Deployment or Job called name.
func podTemplate(t *testing.T, m deploy.Manifests, kind, name string) deploy.PodTemplate {
	t.Helper()
	o, err := m.Get(kind, name)
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Template deploy.PodTemplate `yaml:"template"`
	}
	if err := o.DecodeSpec(&spec); err != nil {
		t.Fatal(err)
	}
	if n := len(spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%s/%s has %d containers, want 1", kind, name, n)
	}
	return spec.Template
}

// podEnviron is the environment container c gets, as NAME=value lines for
// T's loader, and each variable by name. A Secret's values live in the
// cluster: a key it must hold is stood in for from validEnv, an optional
// one is left out (the worst case). It fails the test for a name T does
// not read, a secret not taken from a secretKeyRef, and a reference
// Manifests.Environment cannot resolve.
func podEnviron[T any](t *testing.T, m deploy.Manifests, c deploy.Container) ([]string, map[string]deploy.Var) {
	t.Helper()
	vars, err := m.Environment(c)
	if err != nil {
		t.Error(err)
	}
	known, secrets := envNames[T](), secretNames[T]()
	standIn := validEnv()
	standIn["REDIS_URL"] = "redis://stand-in:6379/0"
	byName := map[string]deploy.Var{}
	for _, v := range vars {
		// GOMEMLIMIT is the Go runtime's own: the pod's memory limit less
		// a margin, so that garbage is collected before the kernel kills.
		if !known[v.Name] && v.Name != "GOMEMLIMIT" {
			t.Errorf("container %s: %s (%s) is not a variable of config.go", c.Name, v.Name, v.From)
		}
		if secrets[v.Name] && v.From != "secretKeyRef" {
			t.Errorf("container %s: secret %s comes from %s, want a secretKeyRef", c.Name, v.Name, v.From)
		}
		byName[v.Name] = v // env after envFrom: the later one wins, as in Kubernetes
	}
	var environ []string
	for name, v := range byName {
		if v.From == "secretKeyRef" {
			if v.Optional {
				continue
			}
			v.Value = standIn[name]
			if v.Value == "" {
				v.Value = "stand-in"
			}
		}
		environ = append(environ, name+"="+v.Value)
	}
	return environ, byName
}

// checkPasses checks that a container passes every variable of T (a
// new one fails here until the manifests carry it), and each required
// one from a key that is not optional.
func checkPasses[T any](t *testing.T, what string, vars map[string]deploy.Var, required []string) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(envNames[T]())) {
		if _, ok := vars[name]; !ok {
			t.Errorf("%s does not pass %s: add it to deploy/configmap.yaml, or for a secret an optional secretKeyRef in the manifest", what, name)
		}
	}
	for _, name := range required {
		if v, ok := vars[name]; ok && v.Optional {
			t.Errorf("%s takes %s, which is required, from an optional key", what, name)
		}
	}
}

func TestDeploymentEnvironment(t *testing.T) {
	t.Parallel()
	m := manifests(t)
	pod := podTemplate(t, m, "Deployment", "munchable-webhooks")
	c := pod.Spec.Containers[0]
	environ, vars := podEnviron[config](t, m, c)
	cfg, err := loadConfig(environ)
	if err != nil {
		t.Fatalf("the deployment's environment (secrets stood in for) does not load:\n%v", err)
	}

	t.Run("every variable, required ones not optional", func(t *testing.T) {
		checkPasses[config](t, "the Deployment", vars, requiredServeVars(t))
	})

	t.Run("ports: http is LISTEN_ADDR, metrics is METRICS_ADDR", func(t *testing.T) {
		checkPorts(t, cfg, pod)
	})

	t.Run("GOMEMLIMIT under the memory limit", func(t *testing.T) {
		// The mail budget bounds what is held; GOMEMLIMIT makes the runtime
		// collect the garbage it leaves before the pod's limit is reached.
		if vars["GOMEMLIMIT"].Value != "200MiB" || c.Resources.Limits["memory"] != "256Mi" {
			t.Errorf("GOMEMLIMIT %q with a memory limit of %q, want 200MiB under 256Mi", vars["GOMEMLIMIT"].Value, c.Resources.Limits["memory"])
		}
	})

	t.Run("shutdown fits in the grace period", func(t *testing.T) {
		// The kubelet's SIGKILL must not cut a delivery short.
		grace := pod.Spec.TerminationGracePeriodSeconds
		if grace == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
			t.Fatal("no terminationGracePeriodSeconds or preStop sleep (deploy/'s tests say why both)")
		}
		pause := c.Lifecycle.PreStop.Sleep.Seconds
		graceD, pauseD := time.Duration(*grace)*time.Second, time.Duration(pause)*time.Second
		if graceD <= cfg.HandlerTimeout+pauseD {
			t.Errorf("terminationGracePeriodSeconds %d <= HANDLER_TIMEOUT %s + preStop %ds", *grace, cfg.HandlerTimeout, pause)
		}
		// serve's own bound after SIGTERM (serve.go).
		if worst := pauseD + cfg.ShutdownDelay + cfg.shutdownGrace(); graceD < worst {
			t.Errorf("terminationGracePeriodSeconds %d < the worst-case shutdown %s", *grace, worst)
		}
	})
}

// The migration Job runs migrate with only what migrate reads.
func TestMigrationJobEnvironment(t *testing.T) {
	t.Parallel()
	m := manifests(t)
	c := podTemplate(t, m, "Job", "munchable-webhooks-migrate").Spec.Containers[0]
	environ, vars := podEnviron[migrateConfig](t, m, c)
	checkPasses[migrateConfig](t, "the migration Job", vars, requiredMigrateVars(t))
	if _, err := loadMigrateConfig(environ); err != nil {
		t.Errorf("the migration job's environment does not load: %v", err)
	}
}

func TestComposeEnvironment(t *testing.T) {
	t.Parallel()
	c, err := deploy.ReadCompose(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	svc := c.Services["webhooks"]
	env := svc.Environment
	known := envNames[config]()
	for name := range env {
		if !known[name] {
			t.Errorf("environment sets %s, which config.go does not read", name)
		}
	}
	for _, name := range requiredServeVars(t) {
		if env[name] == "" {
			t.Errorf("environment lacks %s, which the service requires", name)
		}
	}
	cfg, err := loadConfig(svc.Environ())
	if err != nil {
		t.Fatalf("the service's environment does not load:\n%v", err)
	}

	t.Run("its secrets are refused outside DEV_MODE", func(t *testing.T) {
		if env["DEV_MODE"] != "true" {
			t.Fatalf("DEV_MODE = %q, want true: serve refuses the published secrets otherwise", env["DEV_MODE"])
		}
		var prod []string
		for _, kv := range svc.Environ() {
			if !strings.HasPrefix(kv, "DEV_MODE=") {
				prod = append(prod, kv)
			}
		}
		_, err := loadConfig(prod)
		for _, name := range []string{"DATABASE_URL", "STRIPE_WEBHOOK_SECRET", "RESEND_WEBHOOK_SECRET", "RESEND_API_KEY"} {
			if err == nil || !strings.Contains(err.Error(), name+" is a secret published") {
				t.Errorf("without DEV_MODE, compose's %s is not refused: %v", name, err)
			}
		}
	})

	t.Run("the credentials are dev-only and look it", func(t *testing.T) {
		// The secrets themselves, and the passwords in URLs.
		for name := range secretNames[config]() {
			v := env[name]
			if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
				v, _ = u.User.Password()
			}
			if raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v, "whsec_")); err == nil && strings.HasPrefix(v, "whsec_") {
				v = string(raw)
			}
			if v != "" && !strings.Contains(v, "dev") {
				t.Errorf("%s does not look like a dev-only value", name)
			}
		}
	})

	t.Run("published, listen and healthcheck port are one port", func(t *testing.T) {
		if len(svc.Ports) != 1 {
			t.Fatalf("service publishes %v, want one port", svc.Ports)
		}
		published := svc.Ports[0]
		containerPort := strings.TrimSuffix(published[strings.LastIndex(published, ":")+1:], "/tcp")
		if port := listenPort(t, cfg.ListenAddr); containerPort != port {
			t.Errorf("published container port %s, LISTEN_ADDR port %s", containerPort, port)
		}
		hu, _ := url.Parse(healthzURL(cfg.ListenAddr))
		if hu.Port() != containerPort {
			t.Errorf("healthcheck probes port %s, the container port is %s", hu.Port(), containerPort)
		}
	})
}

// The image exposes the port LISTEN_ADDR's default listens on.
func TestDockerfileExposesListenPort(t *testing.T) {
	t.Parallel()
	d, err := deploy.ReadDockerfile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(environ(validEnv()))
	if err != nil {
		t.Fatal(err)
	}
	var exposed [][]string
	for _, in := range d.Final() {
		if in.Cmd == "EXPOSE" {
			exposed = append(exposed, in.Args)
		}
	}
	if want := [][]string{{listenPort(t, cfg.ListenAddr)}}; !cmp.Equal(exposed, want) {
		t.Errorf("the image exposes %v, want %v (LISTEN_ADDR's default)", exposed, want)
	}
}

// checkPorts checks the container's ports, the scrape annotations and the
// probes against LISTEN_ADDR and METRICS_ADDR.
func checkPorts(t *testing.T, cfg config, pod deploy.PodTemplate) {
	t.Helper()
	c := pod.Spec.Containers[0]
	port, _ := strconv.Atoi(listenPort(t, cfg.ListenAddr))
	if cfg.MetricsAddr == "" {
		t.Fatal("the deployment does not set METRICS_ADDR: /metrics would be on the public port")
	}
	metricsPort, _ := strconv.Atoi(listenPort(t, cfg.MetricsAddr))
	if want := map[string]int{"http": port, "metrics": metricsPort}; !cmp.Equal(c.PortByName(), want) || len(c.Ports) != 2 {
		t.Errorf("container ports %+v, want http %d (LISTEN_ADDR) and metrics %d (METRICS_ADDR)", c.Ports, port, metricsPort)
	}
	wantScrape := map[string]string{
		"prometheus.io/scrape": "true",
		"prometheus.io/port":   strconv.Itoa(metricsPort),
		"prometheus.io/path":   "/metrics",
	}
	for k, v := range wantScrape {
		if got := pod.Metadata.Annotations[k]; got != v {
			t.Errorf("pod annotation %s = %q, want %q", k, got, v)
		}
	}
	for _, p := range []struct {
		name  string
		probe *deploy.Probe
		path  string
	}{
		{"readiness", c.ReadinessProbe, "/readyz"},
		{"liveness", c.LivenessProbe, "/healthz"},
		{"startup", c.StartupProbe, "/healthz"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			if p.name != "startup" {
				t.Errorf("no %s httpGet probe", p.name)
			}
			continue
		}
		// On METRICS_ADDR, which serves the probes too: the public port's
		// connections can all be held by anyone.
		if get := p.probe.HTTPGet; get.Path != p.path || c.Port(get.Port) != metricsPort {
			t.Errorf("%s probe GET %s on port %q, want %s on %d (METRICS_ADDR)", p.name, get.Path, get.Port.Value, p.path, metricsPort)
		}
	}
}
