package dynamolock

import (
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The attributes of a lock item besides its key. The first five are the
// Java DynamoDB Lock Client's names and types, so its tools and ours can
// read each other's items; the fencing token is ours. See docs/dynamolock.md
// for the differences.
const (
	// OwnerAttr is the holder's owner name (string).
	OwnerAttr = "ownerName"
	// RVNAttr is the record version number (string): random, new at every
	// acquisition, heartbeat and release. A waiter that sees it unchanged
	// for a full lease of its own clock may take the lock over.
	RVNAttr = "recordVersionNumber"
	// LeaseAttr is the holder's lease duration in milliseconds (a string of
	// digits, as the Java client writes it).
	LeaseAttr = "leaseDuration"
	// ReleasedAttr is "1" (a string) once the lock is released, absent
	// while it is held, as the Java client does.
	ReleasedAttr = "isReleased"
	// DataAttr is the holder's data payload (binary), absent if none.
	DataAttr = "data"
	// TokenAttr is the fencing token (number): incremented by every
	// acquisition, never by a heartbeat or a release.
	TokenAttr = "fencingToken"
)

// releasedValue is the Java client's value of isReleased.
const releasedValue = "1"

// record is a lock item as read.
type record struct {
	exists   bool
	owner    string
	rvn      string // "" if the item has none
	lease    time.Duration
	released bool
	data     []byte
	token    int64
}

// parseItem reads a lock item; a nil or empty item is an absent lock.
// Attributes of unexpected types are ignored, so a foreign item is treated
// as held by an unknown owner until it is observed unchanged for a lease.
func parseItem(item map[string]types.AttributeValue) record {
	if len(item) == 0 {
		return record{}
	}
	r := record{exists: true}
	if v, ok := item[OwnerAttr].(*types.AttributeValueMemberS); ok {
		r.owner = v.Value
	}
	if v, ok := item[RVNAttr].(*types.AttributeValueMemberS); ok {
		r.rvn = v.Value
	}
	if v, ok := item[LeaseAttr].(*types.AttributeValueMemberS); ok {
		r.lease, _ = parseLease(v.Value)
	}
	// Only the Java client's "1": the acquiring write's condition tests
	// exactly that, and parsing must agree with it (a BOOL true would read
	// as released, fail the condition, and be read again forever).
	if v, ok := item[ReleasedAttr].(*types.AttributeValueMemberS); ok {
		r.released = v.Value == releasedValue
	}
	if v, ok := item[DataAttr].(*types.AttributeValueMemberB); ok {
		r.data = v.Value
	}
	if v, ok := item[TokenAttr].(*types.AttributeValueMemberN); ok {
		r.token, _ = strconv.ParseInt(v.Value, 10, 64)
	}
	return r
}

// maxLease bounds a lease read from an item, so a corrupt value cannot
// make a waiter wait for centuries.
const maxLease = 24 * time.Hour

// parseLease reads a stored lease duration: milliseconds as the Java client
// writes them, or a Go duration ("20s") as cirello.io/dynamolock does. It
// returns false for anything else, negative, zero or above maxLease.
func parseLease(s string) (time.Duration, bool) {
	if s == "" || len(s) > 32 {
		return 0, false
	}
	var d time.Duration
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms <= 0 || ms > int64(maxLease/time.Millisecond) {
			return 0, false
		}
		d = time.Duration(ms) * time.Millisecond
	} else {
		pd, err := time.ParseDuration(s)
		if err != nil {
			return 0, false
		}
		d = pd
	}
	if d <= 0 || d > maxLease {
		return 0, false
	}
	return d, true
}

// formatLease writes a lease as the Java client does: whole milliseconds,
// rounded up.
func formatLease(d time.Duration) string {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(int64(ms), 10)
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// rvnIn returns the condition "#rvn IN (:r0, :r1, ...)" for rvns and adds
// their values to values.
func rvnIn(rvns []string, values map[string]types.AttributeValue) string {
	var b strings.Builder
	b.WriteString("#rvn IN (")
	for i, r := range rvns {
		if i > 0 {
			b.WriteString(", ")
		}
		ph := ":r" + strconv.Itoa(i)
		b.WriteString(ph)
		values[ph] = str(r)
	}
	b.WriteString(")")
	return b.String()
}
