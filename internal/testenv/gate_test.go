package testenv_test

import (
	"context"
	"net"
	"net/url"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// A query through a shut Gate is held, not lost: it is answered once the
// gate opens. A test that ends with the gate shut and a chunk held does
// not hang in the proxy's cleanup.
func TestGateHoldsThenDelivers(t *testing.T) {
	t.Parallel()
	gate := testenv.NewGate()
	dsn := testenv.Proxy(t, testenv.PostgresDSN(t), gate.Relay(), gate.Relay())
	pool := testenv.Pool(t, dsn, 1)
	ctx := context.Background()
	gate.Shut()
	answered := make(chan error, 1)
	go func() {
		var one int
		answered <- pool.QueryRow(ctx, "SELECT 1").Scan(&one)
	}()
	testenv.Until(t, "the query is held", func() (bool, error) { return gate.Held() > 0, nil })
	select {
	case err := <-answered:
		t.Fatalf("a query through a shut gate was answered: %v", err)
	default:
	}
	gate.Open()
	if err := <-answered; err != nil {
		t.Fatalf("the held query, delivered: %v", err)
	}

	// A chunk held when the test ends.
	gate.Shut()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	testenv.Until(t, "the chunk is held", func() (bool, error) { return gate.Held() > 0, nil })
}
