package dynamoconditional

import (
	"encoding/base64"
	"maps"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/observe"
)

// ObserverOption is WithObserver's option. Every constructor of this
// package takes it: it is a StockOption, a HoldsOption, an AccountsOption
// and a FencedOption.
type ObserverOption func(*observe.Observer)

// WithObserver reports each call's outcome to o (nil, the default: none),
// on the calling goroutine, as package conditional's WithObserver does
// (docs/observability.md lists the events): Accounts each Debit
// ("conditional.granted", "conditional.refused" with ErrInsufficient,
// "conditional.failed"; Key, N: the amount; credits report nothing); Holds
// each Hold, HoldAll, Confirm and Release ("conditional.held",
// ".confirmed", ".released", ".refused", ".failed"; Key, N, Duration,
// retries included); Fenced each Update ("conditional.written",
// "conditional.fenced", "conditional.failed"; Key, Token, Duration). A
// Fenced event's Key is the key attribute's value, then "/" and each other
// key attribute's value in the order of their names (a string as is, a
// number as its text, binary in base64). Stock reports each take
// ("conditional.granted", "conditional.refused" with ErrSoldOut,
// "conditional.failed"; Key, N: the units) and each coalesced write of
// several ("conditional.batch"; Key, N: the takes it carried), as
// conditional.Stock does.
func WithObserver(o observe.Observer) ObserverOption {
	return func(p *observe.Observer) { *p = observe.Guard(o) }
}

func (o ObserverOption) applyStock(c *stockConfig) { o(&c.obs) }
func (o ObserverOption) applyHolds(c *holdsConfig) { o(&c.obs) }
func (o ObserverOption) applyAccounts(c *shared)   { o(&c.obs) }
func (o ObserverOption) applyFenced(c *shared)     { o(&c.obs) }

// eventKey is the Key of a Fenced event on key (see WithObserver).
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
