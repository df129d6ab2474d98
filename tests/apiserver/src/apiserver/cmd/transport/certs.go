package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// serviceName is the name in the serving certificate and the client's ServerName, as for a
// webhook Service "modelgate" in namespace "modelgate" (HookClient: <service>.<namespace>.svc).
const serviceName = "modelgate.modelgate.svc"

// authority is a throwaway CA that signs serving certificates, as cert-manager's CA issuer does.
type authority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "modelgate transport harness CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, certPEM: pemBlock("CERTIFICATE", der)}, nil
}

// issue returns a new serving certificate and key (PEM) for serviceName, localhost and
// 127.0.0.1, with a fresh key and serial.
func (a *authority) issue() (certPEM, keyPEM []byte, serial *big.Int, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	serial = randomSerial()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: serviceName},
		DNSNames:     []string{serviceName, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER), serial, nil
}

// certDir is a Secret volume as the kubelet writes it (pkg/volume/util/atomic_writer.go): the
// files live in a timestamped directory, "..data" links to it, tls.crt and tls.key link through
// "..data"; an update writes a new directory and swaps "..data" with one rename, so that a
// reader never sees a new certificate with an old key.
type certDir struct {
	dir     string
	version int
	serial  *big.Int // of the certificate installed last
}

func (d *certDir) certFile() string { return filepath.Join(d.dir, "tls.crt") }
func (d *certDir) keyFile() string  { return filepath.Join(d.dir, "tls.key") }

// write installs a certificate and key, atomically as the kubelet does.
func (d *certDir) write(certPEM, keyPEM []byte) error {
	d.version++
	name := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), d.version)
	payload := filepath.Join(d.dir, name)
	if err := os.MkdirAll(payload, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(payload, "tls.crt"), certPEM, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(payload, "tls.key"), keyPEM, 0o600); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(d.dir, "..data"))
	tmp := filepath.Join(d.dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(name, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		return err
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		link := filepath.Join(d.dir, f)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", f), link); err != nil {
				return err
			}
		}
	}
	if old != "" && old != name {
		return os.RemoveAll(filepath.Join(d.dir, old))
	}
	return nil
}

// newCertDir makes dir and writes a first serving certificate from ca into it.
func newCertDir(dir string, ca *authority) (*certDir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d := &certDir{dir: dir}
	return d, d.rotate(ca)
}

// rotate installs a new serving certificate from ca (new key, new serial), as cert-manager
// renewing the Secret and the kubelet updating the volume do.
func (d *certDir) rotate(ca *authority) error {
	certPEM, keyPEM, serial, err := ca.issue()
	if err != nil {
		return err
	}
	if err := d.write(certPEM, keyPEM); err != nil {
		return err
	}
	d.serial = serial
	return nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err)
	}
	return n
}
