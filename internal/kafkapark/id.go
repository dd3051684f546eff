package kafkapark

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"
)

// ID is a parked message's position in Kafka; with the group it is the
// parked row's key. inbox and partition each export it as ParkedID.
type ID struct {
	Topic     string
	Partition int
	Offset    int64
}

// String is "topic/partition@offset", the Key of the parked event.
func (id ID) String() string { return EventKey(id.Topic, id.Partition, id.Offset) }

// Parse reads back what String wrote. The topic is everything before the
// last "/" that precedes the last "@", so a topic holding either still
// parses (Kafka's own topic names hold neither).
func Parse(s string) (ID, error) {
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return ID{}, errfmt.Errorf("%q is not topic/partition@offset: no @", s)
	}
	slash := strings.LastIndexByte(s[:at], '/')
	if slash < 0 {
		return ID{}, errfmt.Errorf("%q is not topic/partition@offset: no /", s)
	}
	p, perr := strconv.ParseInt(s[slash+1:at], 10, 32)
	o, oerr := strconv.ParseInt(s[at+1:], 10, 64)
	switch {
	case perr != nil:
		return ID{}, errfmt.Errorf("%q: partition %q is not a number", s, s[slash+1:at])
	case oerr != nil:
		return ID{}, errfmt.Errorf("%q: offset %q is not a number", s, s[at+1:])
	}
	id := ID{Topic: s[:slash], Partition: int(p), Offset: o}
	if err := id.Check(); err != nil {
		return ID{}, errfmt.Errorf("%q: %w", s, err)
	}
	if id.String() != s { // "+1", "01": one text per position
		return ID{}, errfmt.Errorf("%q is not as String writes it (%q)", s, id.String())
	}
	return id, nil
}

// Check refuses a position no stored message can have: an empty topic, one
// PostgreSQL text cannot hold, a negative partition or offset.
func (id ID) Check() error {
	switch {
	case id.Topic == "":
		return errors.New("topic is empty")
	case !utf8.ValidString(id.Topic) || strings.IndexByte(id.Topic, 0) >= 0:
		return errfmt.Errorf("topic %q is not UTF-8 without NUL", id.Topic)
	case id.Partition < 0:
		return errfmt.Errorf("partition %d is negative", id.Partition)
	case id.Offset < 0:
		return errfmt.Errorf("offset %d is negative", id.Offset)
	}
	return nil
}
