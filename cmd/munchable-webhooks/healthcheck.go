package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// healthcheckConfig is all the healthcheck needs: the container runtime runs
// it with the service's environment, but it must work with none of it.
type healthcheckConfig struct {
	ListenAddr string `env:"LISTEN_ADDR" envDefault:":8080"`
}

func (c healthcheckConfig) validate() []error {
	if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		return []error{fmt.Errorf("LISTEN_ADDR is %q: want host:port", c.ListenAddr)}
	}
	return nil
}

// healthcheck asks the service in this container whether it serves: the
// distroless image has no shell or curl, so the binary checks itself.
func healthcheck(ctx context.Context, environ []string, stdout io.Writer) error {
	cfg, err := parseEnv[healthcheckConfig](environ)
	if err != nil {
		return err
	}
	url := healthzURL(cfg.ListenAddr)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s: %s", url, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}

// healthzURL is where the service listening on addr answers /healthz. A
// wildcard or empty host means every interface, loopback included; a
// specific host is the only address the service answers on.
func healthzURL(addr string) string {
	host, port, _ := net.SplitHostPort(addr) // validated
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz"
}
