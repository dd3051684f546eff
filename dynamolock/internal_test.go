package dynamolock

import (
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The first-sighting cache stays within its bound, evicting the least
// recently used lock; an evicted lock's wait starts over (always safe).
func TestSightingsBounded(t *testing.T) {
	s := newSightings(3)
	t0 := time.Now()
	for i, k := range []string{"a", "b", "c", "d"} {
		s.observe(k, "v1", t0.Add(time.Duration(i)*time.Second))
	}
	if s.len() != 3 {
		t.Fatalf("len %d, want 3", s.len())
	}
	late := t0.Add(time.Minute)
	if got := s.observe("a", "v1", late); !got.Equal(late) {
		t.Fatalf("evicted key kept its first sighting %v", got)
	}
	if got := s.observe("d", "v1", late); !got.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("same version: first sighting %v, want the original", got)
	}
	if got := s.observe("d", "v2", late); !got.Equal(late) {
		t.Fatalf("new version: first sighting %v, want now", got)
	}
	s.forget("d")
	if s.len() != 2 {
		t.Fatalf("len %d after forget, want 2", s.len())
	}
}

func TestParseItem(t *testing.T) {
	r := parseItem(map[string]types.AttributeValue{
		OwnerAttr: str("o"), RVNAttr: str("r"), LeaseAttr: str("1500"), ReleasedAttr: str("1"),
		DataAttr: &types.AttributeValueMemberB{Value: []byte("d")}, TokenAttr: num(7),
	})
	if !r.exists || r.owner != "o" || r.rvn != "r" || r.lease != 1500*time.Millisecond || !r.released || string(r.data) != "d" || r.token != 7 {
		t.Fatalf("%+v", r)
	}
	if r := parseItem(nil); r.exists {
		t.Fatal("nil item exists")
	}
	// Attributes of unexpected types are ignored: a held lock of unknown owner.
	r = parseItem(map[string]types.AttributeValue{RVNAttr: num(1), ReleasedAttr: &types.AttributeValueMemberBOOL{Value: true}})
	if !r.exists || r.rvn != "" || r.released {
		t.Fatalf("%+v", r)
	}
}

// A stored lease is read back as written, and garbage never yields a lease
// outside (0, 24h].
func FuzzParseLease(f *testing.F) {
	for _, s := range []string{"20000", "20s", "0", "-5", "1h30m", "99999999999999999999", "", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := parseLease(s)
		if ok && (d <= 0 || d > maxLease) {
			t.Fatalf("parseLease(%q) = %v", s, d)
		}
		if ok {
			back, ok2 := parseLease(formatLease(d))
			if !ok2 || back < d || back-d >= time.Millisecond {
				t.Fatalf("lease %v formatted %q read back as %v", d, formatLease(d), back)
			}
		}
	})
}

// Acquire's argument checks never panic and accept exactly the keys
// DynamoDB can store.
func FuzzAcquireConfig(f *testing.F) {
	c := &Client{cfg: config{pkName: "key"}}
	f.Add("job", "", int64(0))
	f.Add("job", "", int64(time.Second))
	f.Add("", "s", int64(-1))
	f.Add("job-\xff", "", int64(0))
	f.Fuzz(func(t *testing.T, key, sortKey string, wait int64) {
		opts := []AcquireOption{WithWait(time.Duration(wait))}
		if sortKey != "" { // refused, even empty, without a sort key name
			opts = append(opts, WithSortKey(sortKey))
		}
		_, err := c.acquireConfig(key, opts)
		valid := key != "" && len(key) <= MaxKeyLen && utf8.ValidString(key) && sortKey == "" && wait > 0
		if (err == nil) != valid {
			t.Fatalf("key %q sort key %q wait %d: err %v", key, sortKey, wait, err)
		}
	})
}
