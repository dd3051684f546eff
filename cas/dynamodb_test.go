package cas_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/internal/services"
)

// A write whose connection is refused was never sent: the backend returns
// the dial error, not ErrAmbiguousCommit.
func TestDynamoDBRefusedConnectionIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	if conn, err := net.Dial("tcp", "127.0.0.1:1"); err == nil {
		conn.Close()
		t.Skip("something listens on 127.0.0.1:1")
	}
	ctx := context.Background()
	b, err := cas.NewDynamoDBBackend(services.DynamoDBClient("http://127.0.0.1:1", nil), "tbl", "pk")
	if err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func() error{
		"create": func() error { return b.Create(ctx, "k", []byte("v")) },
		"put":    func() error { _, err := b.Put(ctx, "k", []byte("v"), 1); return err },
		"delete": func() error { return b.Delete(ctx, "k", 1) },
	} {
		err := write()
		var op *net.OpError
		if errors.Is(err, cas.ErrAmbiguousCommit) || !errors.As(err, &op) || op.Op != "dial" {
			t.Errorf("%s with the connection refused: %v; want the dial error, not ErrAmbiguousCommit", name, err)
		}
	}
}
