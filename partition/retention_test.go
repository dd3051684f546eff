package partition_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/nolock/nolock/partition"
)

// deleteRecords deletes partition p of topic below offset before, as
// retention would (DeleteRecords v1, a raw request: kafka-go has none).
func deleteRecords(t *testing.T, broker, topic string, p int32, before int64) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", broker, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	var b []byte
	b = binary.BigEndian.AppendUint16(b, 21) // api key: DeleteRecords
	b = binary.BigEndian.AppendUint16(b, 1)  // version
	b = binary.BigEndian.AppendUint32(b, 7)  // correlation id
	b = binary.BigEndian.AppendUint16(b, 4)
	b = append(b, "hunt"...) // client id
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint16(b, uint16(len(topic)))
	b = append(b, topic...)
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint32(b, uint32(p))
	b = binary.BigEndian.AppendUint64(b, uint64(before))
	b = binary.BigEndian.AppendUint32(b, 10000) // timeout ms
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	if _, err := conn.Write(append(msg, b...)); err != nil {
		t.Fatal(err)
	}
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		t.Fatal(err)
	}
	resp := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(conn, resp); err != nil {
		t.Fatal(err)
	}
	// correlation id, throttle time, topic count, topic, partition count,
	// partition, low watermark, error code.
	i := 12 + 2 + len(topic) + 4 + 4
	if code := int16(binary.BigEndian.Uint16(resp[i+8:])); code != 0 {
		t.Fatalf("DeleteRecords: error code %d", code)
	}
}

// Messages deleted from Kafka before they were applied stop the
// partition: Run returns ErrOffsetLost naming the gap, the stored offset
// stays, nothing past the gap is applied. Before, kafka-go moved the
// reader up to the log start and the fence (which checks the stored
// offset, not the batch's first) committed offsets 30..39, skipping 20..29
// silently.
func TestDeletedMessagesStopPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 20)
	m := startMember(t, b.pool, b.config("a", nil))
	if err := waitRows(ctx, b.pool, 20); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, 1, 20, 20)
	deleteRecords(t, b.brokers[0], b.topic, 0, 30)

	c, err := newConsumer(b.pool, b.config("b", nil))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = c.Run(runCtx, record("b"))
	if !errors.Is(err, partition.ErrOffsetLost) || runCtx.Err() != nil {
		t.Fatalf("Run: %v; want ErrOffsetLost before the deadline", err)
	}
	t.Log(err)
	r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.next == nil || *r.next != 20 {
		t.Fatalf("stored offset %v after the gap, want 20", r.next)
	}
	var rows int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&rows); err != nil || rows != 20 {
		t.Fatalf("results holds %d rows (%v), want the first 20 only", rows, err)
	}
}
