package deploy_test

// docker-compose.yml's rules among its own services and with make dev;
// cmd/munchable-webhooks/deploy_test.go checks its environment against
// the configuration.

import (
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"

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
		for _, name := range []string{"STRIPE_WEBHOOK_SECRET", "RESEND_WEBHOOK_SECRET", "RESEND_API_KEY", "SUPPORT_INBOUND_ADDRESSES"} {
			if devVars[name] != svc.Environment[name] {
				t.Errorf("make dev sets %s=%q, docker-compose.yml %q", name, devVars[name], svc.Environment[name])
			}
		}
	})
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
