package dynamocas_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/dynamocas"
	"github.com/nolock/nolock/internal/testenv"
)

// An Update that loses its first attempt to another writer logs the retry
// at Debug with its key; WithLogger(nil) is accepted.
func TestLogger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDB(t)
	b, err := dynamocas.NewBackend(client, testenv.Table(t, client, false))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := cas.NewStore[int](b, nil, cas.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other, err := cas.NewStore[int](b, nil, cas.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := s.Create(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	first := true
	v, err := s.Update(ctx, "k", func(v int) (int, error) {
		if first { // another writer gets there first
			first = false
			if _, err := other.Update(ctx, "k", func(v int) (int, error) { return v + 1, nil }); err != nil {
				return 0, err
			}
		}
		return v + 1, nil
	})
	if err != nil || v.Value != 3 {
		t.Fatalf("Update: %v, %v; want 3", v, err)
	}
	if out := buf.String(); !strings.Contains(out, `level=DEBUG msg="cas: conflict; retrying" key=k attempt=1 delay=0s err="cas: version conflict"`) {
		t.Errorf("an Update that lost once logged %q", out)
	}
}
