package dynamoconditional

import (
	"encoding/base64"
	"maps"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/observe"
)

// WithObserver reports each call to o (nil, the default: none): Start
// when it begins, End with its outcome (CallTake, CallDebit, CallHold,
// … say which), on the calling goroutine, as package conditional's
// WithObserver does.
// The events are the package's Event constants, whose docs say their
// fields: Stock reports each take (EventGranted, EventRefused,
// EventFailed) and each coalesced write of several (EventBatch); Accounts
// each Debit (EventGranted, EventRefused, EventFailed; credits report
// nothing); Holds each Hold, HoldAll, HoldAny, Confirm and Release
// (EventHeld, EventConfirmed, EventReleased, EventRefused, EventFailed;
// Get and Free report nothing); Fenced each
// Update (EventWritten, EventFenced, EventFailed).
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.used.Add(setObserver); c.obs = observe.Guard(o) }
}

// eventKey is the Key of a Fenced event on key (see EventWritten).
func eventKey(key map[string]types.AttributeValue, keyAttr string) string {
	var b strings.Builder
	b.WriteString(attrText(key[keyAttr]))
	for _, name := range slices.Sorted(maps.Keys(key)) {
		if name != keyAttr {
			b.WriteString("/" + attrText(key[name]))
		}
	}
	return b.String()
}

// attrText is a key attribute's value as text.
func attrText(v types.AttributeValue) string {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return v.Value
	case *types.AttributeValueMemberN:
		return v.Value
	case *types.AttributeValueMemberB:
		return base64.StdEncoding.EncodeToString(v.Value)
	}
	return ""
}
