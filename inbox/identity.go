package inbox

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
)

// Identity says how a message is recognised when it comes again.
type Identity struct {
	name      string
	id        func(kafka.Message) (string, error)
	watermark bool
	bad       string // why New refuses it: an identity that cannot work
}

// ByHeader identifies a message by the value of a header set by the
// producer (e.g. "id", as Debezium's outbox does). It catches producer
// retries and duplicates, which get new offsets. The recommended identity.
func ByHeader(name string) Identity {
	if name == "" {
		return Identity{bad: "ByHeader: the header name is empty"}
	}
	return Identity{name: "header " + name, id: func(m kafka.Message) (string, error) {
		for _, h := range m.Headers {
			if h.Key == name && len(h.Value) > 0 {
				return string(h.Value), nil
			}
		}
		return "", errfmt.Errorf("%w: no %q header", ErrNoID, name)
	}}
}

// ByFunc identifies a message by a function of it (e.g. a field of the
// payload). An error from id, or an empty id, means the message has no
// identity (ErrNoID): it is parked at once, known by its offset.
func ByFunc(id func(kafka.Message) (string, error)) Identity {
	return Identity{name: "func", id: id}
}

// ByOffset identifies a message by topic/partition/offset: a fallback that
// catches Kafka's redeliveries but NOT a producer's duplicate (a resent
// message gets a new offset).
func ByOffset() Identity {
	return Identity{name: "offset", id: func(m kafka.Message) (string, error) {
		return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10), nil
	}}
}

// ByWatermark keeps, per partition, the next offset to process, updated in
// the same transaction as the effect; a message below it is a duplicate.
// No row per message, so no cleanup; but it needs in-order processing per
// partition (kafka-go's Reader gives it) and, like ByOffset, cannot catch a
// producer's duplicate.
func ByWatermark() Identity { return Identity{name: "watermark", watermark: true} }

// id is the identity of msg for the attempts and parked tables (watermark
// mode records those by offset).
func (in *Inbox) id(msg kafka.Message) (string, error) {
	if in.identity.watermark {
		return ByOffset().id(msg)
	}
	id, err := in.identity.id(msg)
	switch {
	case err != nil && !errors.Is(err, ErrNoID):
		return "", errfmt.Errorf("%w: %w", ErrNoID, err)
	case err != nil:
		return "", err
	case id == "":
		return "", errfmt.Errorf("%w: the %s identity is empty", ErrNoID, in.identity.name)
	case len(id) > MaxIDLen:
		return "", errfmt.Errorf("%w: the %s identity is %d bytes, over %d", ErrNoID, in.identity.name, len(id), MaxIDLen)
	case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
		// PostgreSQL's text takes neither (a raw binary UUID, say).
		return "", errfmt.Errorf("%w: the %s identity %q is not text without NUL bytes", ErrNoID, in.identity.name, id)
	}
	return id, nil
}

// MaxIDLen bounds a message's identity in bytes: identities live in a
// primary-key index, whose rows PostgreSQL keeps under about 2.7 kB. A
// longer one counts as no identity (ErrNoID).
const MaxIDLen = 2048
