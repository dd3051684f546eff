package dynamocas_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/dynamocas"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// A write whose connection is refused was never sent: the backend returns
// the dial error, not ErrAmbiguousCommit.
func TestRefusedConnectionIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	refused := testenv.RefusedEndpoint(t)
	ctx := context.Background()
	b, err := dynamocas.NewBackend(services.DynamoDBClient(refused, nil), "tbl")
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

// NewStore refuses a nil backend before anything else, as cas.NewStore
// does: a nil *Backend is not a usable one.
func TestNewStoreRefusesNilBackend(t *testing.T) {
	t.Parallel()
	if _, err := cas.NewStore[int](nil, nil); !errors.Is(err, cas.ErrInvalid) {
		t.Fatalf("NewStore(nil): %v, want ErrInvalid", err)
	}
}
