// Package kafkadial builds the kafka.Transport that opens connections
// exactly as a kafka.Dialer does, for the kafka-go clients (Client,
// Transport-based requests) that take a Transport rather than a Dialer.
package kafkadial

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
)

// noDialTimeout stands for a Dialer's zero Timeout (none) in a
// kafka.Transport, whose zero DialTimeout means 5 s.
const noDialTimeout = 100 * 365 * 24 * time.Hour

// Transport returns a kafka.Transport that opens connections as d
// does: d's Resolver, then d's DialFunc or a net.Dialer with d's
// LocalAddr, FallbackDelay and KeepAlive, within d's Deadline, then TLS
// with d's TLS config (the server name, if unset, from the resolved host,
// as d does), then SASL with d's SASLMechanism; the whole within d's
// Timeout (none when zero), and requests carry d's ClientID. d's DualStack
// is ignored, as Go's net.Dialer ignores it (fast fallback is on by
// default; a negative FallbackDelay turns it off), and d's
// TransactionalID is for producers.
func Transport(d *kafka.Dialer) *kafka.Transport {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = noDialTimeout
	}
	return &kafka.Transport{
		Dial:        dialFunc(d),
		DialTimeout: timeout,
		ClientID:    d.ClientID,
		SASL:        d.SASLMechanism,
		// TLS stays nil here: dialFunc does it, after the Resolver.
	}
}

// dialFunc opens a connection as d.DialContext does, up to and including
// TLS; the Transport then does SASL.
func dialFunc(d *kafka.Dialer) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		if !d.Deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d.Deadline)
			defer cancel()
		}
		address, err := lookupHost(ctx, address, d.Resolver)
		if err != nil {
			return nil, errfmt.Errorf("failed to resolve host: %w", err)
		}
		dial := d.DialFunc
		if dial == nil {
			dial = (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
		}
		conn, err := dial(ctx, network, address)
		if err != nil {
			return nil, errfmt.Errorf("failed to open connection to %s: %w", address, err)
		}
		if d.TLS == nil {
			return conn, nil
		}
		cfg := d.TLS
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName, _ = splitHostPort(address)
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return tc, nil
	}
}

// lookupHost resolves address's host with r, as kafka.Dialer does: the
// first address r returns replaces the host, and gives the port only when
// address had none; r returning nothing keeps address.
func lookupHost(ctx context.Context, address string, r kafka.Resolver) (string, error) {
	host, port := splitHostPort(address)
	if r != nil {
		resolved, err := r.LookupHost(ctx, host)
		if err != nil {
			return "", errfmt.Errorf("failed to resolve host %s: %w", host, err)
		}
		if len(resolved) > 0 {
			rhost, rport := splitHostPort(resolved[0])
			host = rhost
			if port == "" {
				port = rport
			}
		}
	}
	return net.JoinHostPort(host, port), nil
}

// splitHostPort splits address as kafka.Dialer does: an address that is
// neither host:port nor :port is a host on port 9092.
func splitHostPort(address string) (host, port string) {
	host, port, _ = net.SplitHostPort(address)
	if host == "" && port == "" {
		host, port = address, "9092"
	}
	return host, port
}
