package window

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

func serve(t *testing.T, svc windowv1.WindowServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	windowv1.RegisterWindowServiceServer(srv, svc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TLS from the environment: WINDOW_SIDECAR_TLS_CA verifies the sidecar, _CERT and _KEY are
// the client's certificate for a sidecar that requires one, _SERVER_NAME the name verified.
func TestMutualTLSFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := certificate(t, nil, nil, "test-ca", nil)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	srvCert, srvKey := certificate(t, ca, caKey, "sidecar", []string{"sidecar.test"})
	cliCert, cliKey := certificate(t, ca, caKey, "client", nil)
	writePEM(t, filepath.Join(dir, "client.pem"), "CERTIFICATE", cliCert.Raw)
	keyDER, err := x509.MarshalECPrivateKey(cliKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "client.key"), "EC PRIVATE KEY", keyDER)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvCert.Raw}, PrivateKey: srvKey}},
		ClientCAs:    pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	auth := make(chan []string, 4)
	addr := serve(t, &publishSpy{auth: auth}, grpc.Creds(creds))
	publish := func() error {
		c, err := Dial(addr)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = c.Publish(ctx, "s", Message{Payload: []byte("x")})
		return err
	}
	t.Setenv(TLSCAEnv, filepath.Join(dir, "ca.pem"))
	t.Setenv(TLSServerNameEnv, "sidecar.test")
	t.Setenv(TokenEnv, "tok")
	if err := publish(); err == nil {
		t.Fatal("no client certificate: no error")
	}
	t.Setenv(TLSCertEnv, filepath.Join(dir, "client.pem"))
	t.Setenv(TLSKeyEnv, filepath.Join(dir, "client.key"))
	if err := publish(); err != nil {
		t.Fatal(err)
	}
	if got := <-auth; len(got) != 1 || got[0] != "Bearer tok" {
		t.Fatalf("authorization: %v", got)
	}
	t.Setenv(TLSServerNameEnv, "other.test")
	if err := publish(); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("wrong server name: %v", err)
	}
	os.Unsetenv(TLSCAEnv)
	if _, err := Dial(addr); err == nil {
		t.Fatal("a client certificate without a CA: no error")
	}
}

func certificate(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, cn string, dns []string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
