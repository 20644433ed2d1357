package deploy_test

// docker-compose.yml's rules among its own services and with make dev;
// cmd/munchable-webhooks/deploy_test.go checks its environment against
// the configuration.

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/deploy"
)

func TestDockerCompose(t *testing.T) {
	t.Parallel()
	c, err := deploy.ReadCompose(root)
	if err != nil {
		t.Fatal(err)
	}
	pg, rd, svc := c.Services["postgres"], c.Services["redis"], c.Services["webhooks"]

	t.Run("postgres", func(t *testing.T) {
		if pg.Image != "postgres:15" || !slices.Contains(pg.Healthcheck.Test, "pg_isready") {
			t.Errorf("postgres: image %q, healthcheck %v; want postgres:15 checked with pg_isready", pg.Image, pg.Healthcheck.Test)
		}
		checkLoopbackPort(t, pg, "5432")
	})

	t.Run("redis", func(t *testing.T) {
		if rd.Image != "redis:7" || !cmp.Equal(rd.Healthcheck.Test, []string{"CMD", "redis-cli", "ping"}) {
			t.Errorf("redis: image %q, healthcheck %v; want redis:7 checked with redis-cli ping", rd.Image, rd.Healthcheck.Test)
		}
		if i := slices.Index(rd.Command, "--maxmemory-policy"); i < 0 || i+1 >= len(rd.Command) || rd.Command[i+1] != "noeviction" {
			t.Errorf("redis command %v, want --maxmemory-policy noeviction", rd.Command)
		}
		checkLoopbackPort(t, rd, "6379")
	})

	t.Run("webhooks builds the Dockerfile and waits for both", func(t *testing.T) {
		if svc.Build.Context != "." || svc.Build.Dockerfile != "Dockerfile" {
			t.Errorf("service build = %+v, want the Dockerfile", svc.Build)
		}
		for _, dep := range []string{"postgres", "redis"} {
			if svc.DependsOn[dep].Condition != "service_healthy" {
				t.Errorf("service depends_on %s: %+v, want condition service_healthy", dep, svc.DependsOn[dep])
			}
		}
		if want := []string{"CMD", "/munchable-webhooks", "healthcheck"}; !cmp.Equal(svc.Healthcheck.Test, want) {
			t.Errorf("service healthcheck = %v, want %v", svc.Healthcheck.Test, want)
		}
		// Its container port is LISTEN_ADDR's (cmd checks which).
		if len(svc.Ports) != 1 {
			t.Fatalf("service publishes %v, want one port", svc.Ports)
		}
		checkLoopbackPort(t, svc, "")
	})

	t.Run("webhooks reaches postgres and redis by service name", func(t *testing.T) {
		env := svc.Environment
		db, err := url.Parse(env["DATABASE_URL"])
		if err != nil {
			t.Fatal(err)
		}
		pw, _ := db.User.Password()
		gotDB := []string{db.Hostname(), db.User.Username(), pw, strings.TrimPrefix(db.Path, "/")}
		if want := []string{"postgres", pg.Environment["POSTGRES_USER"], pg.Environment["POSTGRES_PASSWORD"], pg.Environment["POSTGRES_DB"]}; !cmp.Equal(gotDB, want) {
			t.Errorf("DATABASE_URL host, user, password, db = %v; postgres service has %v", gotDB, want)
		}
		if r, err := url.Parse(env["REDIS_URL"]); err != nil || r.Hostname() != "redis" {
			t.Errorf("REDIS_URL = %q, want the redis service", env["REDIS_URL"])
		}
	})

	t.Run("make dev runs with the same dev values", func(t *testing.T) {
		devVars, err := deploy.MakeDevVars(root)
		if err != nil {
			t.Fatal(err)
		}
		// Every default of make dev but where it listens: the secrets,
		// DEV_MODE, the sweeps and verify off, private downloads.
		for name, v := range devVars {
			if name != "LISTEN_ADDR" && v != svc.Environment[name] {
				t.Errorf("make dev sets %s=%q, docker-compose.yml %q", name, v, svc.Environment[name])
			}
		}
		for _, name := range []string{"STRIPE_WEBHOOK_SECRET", "RESEND_WEBHOOK_SECRET", "RESEND_API_KEY", "SUPPORT_INBOUND_ADDRESSES", "DEV_MODE", "SWEEP_INTERVAL", "VERIFY_INTERVAL"} {
			if devVars[name] == "" {
				t.Errorf("make dev does not set %s", name)
			}
		}
	})

	// make dev's stand-ins are services built from the repository's tools,
	// and the service talks to them, never to Resend or Stripe.
	for _, st := range []struct{ name, urlVar string }{{"devresend", "RESEND_API_URL"}, {"devstripe", "STRIPE_API_URL"}} {
		t.Run("the stand-in "+st.name, func(t *testing.T) {
			s := c.Services[st.name]
			if !strings.HasPrefix(s.Image, "golang:") || len(s.Command) != 3 || s.Command[0] != "sh" {
				t.Fatalf("%s: image %q, command %q; want the Go image building the tool", st.name, s.Image, s.Command)
			}
			script := s.Command[2]
			if !strings.Contains(script, "go build -buildvcs=false -o /tmp/"+st.name+" ./tools/"+st.name+" && exec /tmp/"+st.name+" ") {
				t.Errorf("%s builds and runs %q, want ./tools/%s", st.name, script, st.name)
			}
			if _, err := os.Stat(filepath.Join(root, "tools", st.name, "main.go")); err != nil {
				t.Errorf("%s: %v", st.name, err)
			}
			m := regexp.MustCompile(`-addr :(\d+)`).FindStringSubmatch(script)
			if m == nil {
				t.Fatalf("%s listens where? %q has no -addr :PORT", st.name, script)
			}
			port := m[1]
			checkLoopbackPort(t, s, port)
			if !slices.Contains(s.Healthcheck.Test, "http://127.0.0.1:"+port+"/") {
				t.Errorf("%s healthcheck %v, want a probe of port %s", st.name, s.Healthcheck.Test, port)
			}
			if got, want := svc.Environment[st.urlVar], "http://"+st.name+":"+port; got != want {
				t.Errorf("webhooks %s = %q, want %q (the stand-in)", st.urlVar, got, want)
			}
			if svc.DependsOn[st.name].Condition != "service_healthy" {
				t.Errorf("webhooks depends_on %s: %+v, want condition service_healthy", st.name, svc.DependsOn[st.name])
			}
		})
	}
	t.Run("the stand-ins' key and downloads", func(t *testing.T) {
		if svc.Environment["STRIPE_API_KEY"] == "" || svc.Environment["RESEND_DOWNLOAD_ALLOW_PRIVATE"] != "true" {
			t.Errorf("webhooks STRIPE_API_KEY %q, RESEND_DOWNLOAD_ALLOW_PRIVATE %q; want a key for the Stripe stand-in and private downloads from the Resend one",
				svc.Environment["STRIPE_API_KEY"], svc.Environment["RESEND_DOWNLOAD_ALLOW_PRIVATE"])
		}
		if key := c.Services["devresend"].Environment["RESEND_API_KEY"]; key != svc.Environment["RESEND_API_KEY"] {
			t.Errorf("devresend accepts RESEND_API_KEY %q, the service sends %q", key, svc.Environment["RESEND_API_KEY"])
		}
	})
}

// No Docker engine runs where the tests do: docker-compose.yml is loaded,
// validated against the Compose Specification's schema, interpolated and
// rendered by compose-go, the loader of Docker Compose v2 (docker compose
// config), and what it renders is checked.
func TestComposeRendersAsDockerCompose(t *testing.T) {
	t.Parallel()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatalf("docker compose would refuse docker-compose.yml: %v", err)
	}
	rendered, err := p.MarshalYAML()
	if err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return
	}
	defer func() {
		if t.Failed() {
			t.Logf("rendered:\n%s", rendered)
		}
	}()
	if got, want := p.ServiceNames(), []string{"devresend", "devstripe", "postgres", "redis", "webhooks"}; !cmp.Equal(sorted(got), want) {
		t.Errorf("services %v, want %v", got, want)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"devresend", "devstripe"} {
		s := p.Services[name]
		if len(s.Volumes) == 0 || s.Volumes[0].Type != types.VolumeTypeBind || s.Volumes[0].Source != abs || s.Volumes[0].Target != "/src" || !s.Volumes[0].ReadOnly {
			t.Errorf("%s mounts %+v first, want the checkout read-only on /src", name, s.Volumes)
		}
		if s.WorkingDir != "/src" || s.HealthCheck == nil || s.HealthCheck.StartPeriod == nil {
			t.Errorf("%s: working_dir %q, healthcheck %+v; want /src and a start period for its first build", name, s.WorkingDir, s.HealthCheck)
		}
	}
	w := p.Services["webhooks"]
	if w.Build == nil || w.Build.Context != abs || w.Build.Dockerfile != "Dockerfile" {
		t.Errorf("webhooks build %+v, want the repository's Dockerfile", w.Build)
	}
	for _, dep := range []string{"postgres", "redis", "devresend", "devstripe"} {
		if w.DependsOn[dep].Condition != types.ServiceConditionHealthy {
			t.Errorf("webhooks depends_on %s: %+v, want service_healthy", dep, w.DependsOn[dep])
		}
	}
	for name, want := range map[string]string{"DEV_MODE": "true", "SWEEP_INTERVAL": "0", "VERIFY_INTERVAL": "0", "RESEND_API_URL": "http://devresend:8025"} {
		if v := w.Environment[name]; v == nil || *v != want {
			t.Errorf("webhooks renders %s=%v, want %q", name, v, want)
		}
	}
	for _, s := range p.Services {
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %s:%d on %q, want 127.0.0.1 only", s.Name, port.Published, port.Target, port.HostIP)
			}
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// checkLoopbackPort checks that s publishes exactly one port, on
// 127.0.0.1 only (the dev secrets and passwords are public), and, unless
// container is empty, that it is that container port.
func checkLoopbackPort(t *testing.T, s deploy.ComposeService, container string) {
	t.Helper()
	if len(s.Ports) != 1 {
		t.Errorf("publishes %v, want one port on 127.0.0.1", s.Ports)
		return
	}
	p := strings.TrimSuffix(s.Ports[0], "/tcp")
	i := strings.LastIndex(p, ":")
	host, _, err := net.SplitHostPort(p[:max(i, 0)])
	if i < 0 || err != nil || host != "127.0.0.1" {
		t.Errorf("publishes %q, want 127.0.0.1:HOST_PORT:CONTAINER_PORT (loopback only)", s.Ports[0])
	}
	if container != "" && p[i+1:] != container {
		t.Errorf("publishes container port %s, want %s", p[i+1:], container)
	}
}
