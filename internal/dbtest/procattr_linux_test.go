package dbtest

import "testing"

// Kill returns only once the server's backends are dead too. Each backend
// leads a process group of its own (Postgres calls setsid() in every
// child), so killing the postmaster's group left them running for a moment:
// under load, long enough to commit a write the test expected to fail.
func TestKillTakesBackends(t *testing.T) {
	t.Parallel()
	s := StartPostgres(t)
	conn := connect(t, s.URL())
	var backend int
	if err := conn.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if !alive(backend) {
		t.Fatalf("backend %d not found in /proc before Kill", backend)
	}
	s.Kill()
	if alive(backend) {
		t.Fatalf("backend %d still alive when Kill returned", backend)
	}
}
