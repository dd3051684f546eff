// Package kafkapark is how inbox and partition store a parked Kafka
// message's text and headers in PostgreSQL, and read them back.
package kafkapark

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/nolock/nolock/observe"
	"github.com/segmentio/kafka-go"
)

// Text makes s storable as PostgreSQL text: valid UTF-8, no NUL bytes
// (each bad byte sequence and each NUL becomes U+FFFD).
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// storedHeader is one element of the parked headers column.
type storedHeader struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Base64 []byte `json:"base64,omitempty"`
}

// HeadersJSON is the parked headers column: a JSON array of {"key",
// "value"} in order (repeated keys kept), a value that is not storable
// text given as "base64" instead, so that every value reads back as it
// was (HeadersFromJSON); a key is stored as Text. It is a string, not
// bytes: in pgx's exec and simple-protocol modes bytes are sent as bytea,
// which a jsonb column refuses.
func HeadersJSON(hs []kafka.Header) string {
	out := make([]storedHeader, len(hs))
	for i, h := range hs {
		out[i].Key = Text(h.Key)
		if v := string(h.Value); Text(v) == v {
			out[i].Value = v
		} else {
			out[i].Base64 = h.Value
		}
	}
	b, _ := json.Marshal(out) // strings and bytes only: cannot fail
	return string(b)
}

// HeadersFromJSON reads the parked headers column back, in order.
func HeadersFromJSON(b []byte) ([]kafka.Header, error) {
	var stored []storedHeader
	if err := json.Unmarshal(b, &stored); err != nil {
		return nil, err
	}
	hs := make([]kafka.Header, len(stored))
	for i, h := range stored {
		hs[i] = kafka.Header{Key: h.Key, Value: h.Base64}
		if h.Base64 == nil {
			hs[i].Value = []byte(h.Value)
		}
	}
	return hs, nil
}

// EventKey is the Key of an inbox or partition event: "topic/partition",
// and "@offset" for an event about one message (offset >= 0).
func EventKey(topic string, partition int, offset int64) string {
	k := topic + "/" + strconv.Itoa(partition)
	if offset >= 0 {
		k += "@" + strconv.FormatInt(offset, 10)
	}
	return k
}

// Observed returns m as the Message of an observe.Call (sharing its
// header values).
func Observed(m kafka.Message) *observe.Message {
	o := &observe.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
	if len(m.Headers) > 0 {
		o.Headers = make([]observe.Header, len(m.Headers))
		for i, h := range m.Headers {
			o.Headers[i] = observe.Header{Key: h.Key, Value: h.Value}
		}
	}
	return o
}
