package partition_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// Kafka request API keys the test expects to see on the Dialer's
// connections, by who sends them.
var wantRequests = map[int16]string{
	3:  "Metadata (readers, transport, partition watch)",
	1:  "Fetch (readers and classifying fetches)",
	2:  "ListOffsets (readers)",
	10: "FindCoordinator (group)",
	11: "JoinGroup (group)",
	14: "SyncGroup (group)",
	12: "Heartbeat (group)",
	8:  "OffsetCommit (KafkaCommitInterval)",
	15: "DescribeGroups (claims)",
}

// The Dialer opens every connection, with all of its settings: the
// brokers are given by a name only its Resolver knows (the transport
// behind claims and classifying fetches once lost the Resolver, and
// claims then failed), its DialFunc sees the group's, the readers', the
// commits' and the claims' requests, each carrying its ClientID, and the
// coordinator knows the member by that ClientID. RackID puts the
// rack-aware balancer first; the group chose it (the member's metadata is
// its user data, the rack).
func TestDialerOpensEveryConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 2)
	produce(t, b.brokers, b.topic, 2, 0, 20)
	host, port, err := net.SplitHostPort(b.brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	const fake = "nolock-kafka.invalid"
	clientID := testenv.Name("client")
	var sn sniffer
	var dials atomic.Int64
	cfg := b.config("m", nil)
	cfg.brokers = []string{net.JoinHostPort(fake, port)}
	cfg.with(partition.WithKafkaCommitInterval(time.Millisecond))
	cfg.with(partition.WithRackID("rack-a"))
	cfg.with(partition.WithDialer(&kafka.Dialer{
		ClientID: clientID,
		Timeout:  10 * time.Second,
		Resolver: resolverFunc(func(_ context.Context, h string) ([]string, error) {
			if h == fake {
				return []string{host}, nil
			}
			return nil, nil
		}),
		DialFunc: func(ctx context.Context, network, address string) (net.Conn, error) {
			dials.Add(1)
			conn, err := (&net.Dialer{}).DialContext(ctx, network, address)
			if err != nil {
				return nil, err
			}
			return &sniffConn{Conn: conn, s: &sn}, nil
		},
	}))
	m := startMember(t, b.pool, cfg)
	if err := waitRows(ctx, b.pool, 40); err != nil {
		t.Fatal(err)
	}
	testenv.Until(t, "every kind of request seen on the Dialer's connections", func() (bool, error) {
		return len(sn.missing()) == 0, nil
	})
	g := describeGroup(t, b)
	if len(g.Members) != 1 || g.Members[0].ClientID != clientID || string(g.Members[0].MemberMetadata.UserData) != "rack-a" {
		t.Errorf("the coordinator's view of the group: %+v; want one member with client ID %s and user data rack-a", g.Members, clientID)
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ids := sn.clientIDs(); !slices.Equal(ids, []string{clientID}) {
		t.Errorf("client IDs on the Dialer's connections: %q; want only %q", ids, clientID)
	}
	tl, err := count(ctx, b.pool, 2, 20)
	if err != nil || !tl.exact() {
		t.Fatalf("results: %v (%v)", tl, err)
	}
	t.Logf("%d dials through the Dialer; requests by API key: %v", dials.Load(), sn.counts())
}

// Fetches wait for MinBytes up to MaxWait: one message, produced before
// the member starts, is applied no sooner than the broker held the first
// fetch for it (MaxWait less kafka-go's 1 s round-trip allowance). With
// the default MaxWait, the broker would answer within 0.75 s.
func TestMaxWaitHonoured(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 1)
	const maxWait = 2900 * time.Millisecond // below the tests' RebalanceTimeout
	claimed := make(chan time.Time, 1)
	applied := make(chan time.Time, 1)
	rec := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		select {
		case applied <- time.Now():
		default:
		}
		return rec(ctx, tx, msgs)
	})
	cfg.with(partition.WithMinBytes(partition.DefaultMaxBytes), partition.WithMaxWait(maxWait))
	cfg.with(partition.WithOnClaim(func(partition.Claim) {
		select {
		case claimed <- time.Now():
		default:
		}
	}))
	m := startMember(t, b.pool, cfg)
	if err := waitRows(ctx, b.pool, 1); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	at, first := <-claimed, <-applied
	if held := maxWait - time.Second; first.Sub(at) < held {
		t.Errorf("the message was applied %v after the claim; the broker should have held the fetch for %v", first.Sub(at), held)
	}
}

// describeGroup returns b's group as the coordinator sees it.
func describeGroup(t testing.TB, b *bed) kafka.DescribeGroupsResponseGroup {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	res, err := client.DescribeGroups(context.Background(), &kafka.DescribeGroupsRequest{GroupIDs: []string{b.group}})
	if err != nil || len(res.Groups) != 1 || res.Groups[0].Error != nil {
		t.Fatalf("DescribeGroups: %+v, %v", res, err)
	}
	return res.Groups[0]
}

type resolverFunc func(ctx context.Context, host string) ([]string, error)

func (f resolverFunc) LookupHost(ctx context.Context, host string) ([]string, error) {
	return f(ctx, host)
}

// sniffer records the API key and client ID of every Kafka request written
// to its connections.
type sniffer struct {
	mu   sync.Mutex
	keys map[int16]int
	ids  map[string]bool
}

func (s *sniffer) saw(key int16, clientID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys, s.ids = map[int16]int{}, map[string]bool{}
	}
	s.keys[key]++
	s.ids[clientID] = true
}

func (s *sniffer) missing() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, what := range wantRequests {
		if s.keys[k] == 0 {
			out = append(out, what)
		}
	}
	return out
}

func (s *sniffer) counts() map[int16]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int16]int, len(s.keys))
	for k, n := range s.keys {
		out[k] = n
	}
	return out
}

func (s *sniffer) clientIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id := range s.ids {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// sniffConn parses the requests written to it (plaintext Kafka: a 4-byte
// size, then the header: API key, version, correlation ID, client ID).
type sniffConn struct {
	net.Conn
	s   *sniffer
	mu  sync.Mutex
	buf []byte
}

func (c *sniffConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p[:n]...)
	for len(c.buf) >= 4 {
		size := int(binary.BigEndian.Uint32(c.buf))
		if len(c.buf) < 4+size {
			break
		}
		req := c.buf[4 : 4+size]
		c.buf = c.buf[4+size:]
		if len(req) < 10 {
			c.s.saw(-1, fmt.Sprintf("short request %x", req))
			continue
		}
		id := ""
		if l := int(int16(binary.BigEndian.Uint16(req[8:]))); l > 0 && len(req) >= 10+l {
			id = string(req[10 : 10+l])
		}
		c.s.saw(int16(binary.BigEndian.Uint16(req)), id)
	}
	return n, err
}
