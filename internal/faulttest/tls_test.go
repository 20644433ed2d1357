package faulttest_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// The service on Postgres and Redis that serve TLS with a certificate from
// a private CA (docs/WHERE-IT-RUNS.md, "A private CA"). Go reads
// SSL_CERT_FILE once per process, which is why this runs the binary.

// unknownCA is how Go's crypto/x509 names a certificate from a CA it does
// not trust.
const unknownCA = "x509: certificate signed by unknown authority"

// TestServiceWithPrivateCA: given the CA (sslrootcert in DATABASE_URL for
// Postgres, SSL_CERT_FILE for rediss://), the service serves over both and
// a signed delivery is claimed, applied and stored. Without sslrootcert
// (and SSL_CERT_FILE) it refuses to start and says why, while
// SSL_CERT_FILE alone serves Postgres too; without SSL_CERT_FILE it serves,
// fails open and reports the claim store unusable, naming the certificate.
func TestServiceWithPrivateCA(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fault suite: runs the service binary against throwaway servers; not in -short")
	}
	ca := newPrivateCA(t)
	r := newTopoRigOn(t, dbtest.StartPostgresTLS(t, ca.certFile, ca.keyFile))
	rs := dbtest.StartRedisTLS(t, ca.certFile, ca.keyFile, ca.caFile)
	verifyFull := strings.Replace(r.pg.URL(), "sslmode=disable", "sslmode=verify-full", 1)
	withRoot := verifyFull + "&sslrootcert=" + ca.caFile

	t.Run("with the CA", func(t *testing.T) {
		r := r.in(t)
		svc := r.serviceOn(map[string]string{
			"DATABASE_URL":  withRoot,
			"REDIS_URL":     rs.URL(),
			"SSL_CERT_FILE": ca.caFile,
		})
		wantClaimsWork(t, svc)
		ev := subEvent(1, "active")
		ev.ID, ev.SubscriptionID = "evt_tls_1", "sub_tls_1"
		if a := r.stripe(svc, ev); !a.OK() || a.Idempotency != "first" {
			t.Fatalf("delivery: %v, want 2xx first", a)
		}
		if e, ok := r.entitlement(ev.SubscriptionID); !ok || e.Status != "active" || e.LastEventID != ev.ID {
			t.Fatalf("entitlement of %s = %+v (found %v), want active from %s", ev.SubscriptionID, e, ok, ev.ID)
		}
		// The claim was confirmed done in Redis, over TLS.
		if a := r.stripe(svc, ev); !a.OK() || a.Idempotency != "duplicate" {
			t.Fatalf("second delivery: %v, want 2xx duplicate", a)
		}
		// The rig's own connections are plain; the service's are not.
		if n := r.count(`SELECT count(*) FROM pg_stat_ssl WHERE ssl`); n == 0 {
			t.Fatal("no TLS connection to Postgres while the service serves")
		}
	})

	t.Run("without sslrootcert", func(t *testing.T) {
		wantStartupFailure(t, r.env(map[string]string{"DATABASE_URL": verifyFull, "REDIS_URL": rs.URL()}), unknownCA)
	})

	// pgx verifies against the system roots when sslrootcert is absent,
	// and Go's system roots are SSL_CERT_FILE's when it is set.
	t.Run("SSL_CERT_FILE for both", func(t *testing.T) {
		r := r.in(t)
		svc := r.serviceOn(map[string]string{
			"DATABASE_URL":  verifyFull,
			"REDIS_URL":     rs.URL(),
			"SSL_CERT_FILE": ca.caFile,
		})
		wantClaimsWork(t, svc)
	})

	t.Run("without SSL_CERT_FILE", func(t *testing.T) {
		r := r.in(t)
		svc := r.serviceOn(map[string]string{"DATABASE_URL": withRoot, "REDIS_URL": rs.URL()})
		wantClaimsUnusable(t, svc, unknownCA)
		// Failing open: the delivery is applied without a claim.
		ev := subEvent(2, "active")
		ev.ID, ev.SubscriptionID = "evt_tls_2", "sub_tls_2"
		if a := r.stripe(svc, ev); !a.OK() || a.Idempotency != "degraded" {
			t.Fatalf("delivery: %v, want 2xx degraded", a)
		}
		if _, ok := r.entitlement(ev.SubscriptionID); !ok {
			t.Fatalf("no entitlement for %s", ev.SubscriptionID)
		}
	})
}

// privateCA is a throwaway CA and a server certificate it issued for
// 127.0.0.1 and localhost, as PEM files.
type privateCA struct {
	caFile, certFile, keyFile string
}

func newPrivateCA(t *testing.T) privateCA {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "faulttest private CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	ca := privateCA{
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "server.pem"),
		keyFile:  filepath.Join(dir, "server.key"),
	}
	for _, f := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{
		{ca.caFile, "CERTIFICATE", caDER, 0o644},
		{ca.certFile, "CERTIFICATE", der, 0o644},
		{ca.keyFile, "PRIVATE KEY", keyDER, 0o600},
	} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return ca
}
