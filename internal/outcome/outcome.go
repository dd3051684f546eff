// Package outcome names what an error proves about a write, whatever the
// store: one meaning, one name. internal/pgerr classifies PostgreSQL's
// errors into it, internal/ddberr DynamoDB's.
package outcome

// Outcome is what an error proves about a write.
type Outcome int

// The outcomes, from the caller's side.
const (
	// Committed: no error, the write applied.
	Committed Outcome = iota + 1
	// NotSent: nothing reached the server. Safe to send again, whatever
	// the write.
	NotSent
	// Refused: the server answered no: nothing changed.
	Refused
	// Unknown: the write may have reached the server and applied. Send it
	// again only if it is idempotent by its key or condition.
	Unknown
)

var names = [...]string{Committed: "committed", NotSent: "not sent", Refused: "refused", Unknown: "unknown"}

// String names the outcome in words.
func (o Outcome) String() string {
	if o < Committed || o > Unknown {
		return "invalid outcome"
	}
	return names[o]
}
