package nolockotel

import (
	"context"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/nolock/nolock/observe"
)

// Inject writes the trace context of ctx (W3C traceparent and tracestate
// with propagation.TraceContext) into m's headers through the Adapter's
// propagator, replacing headers of the same keys, so that a consumer's
// Extract (and the inbox's and partition's spans) continue the
// producer's trace. Call it before kafka.Writer.WriteMessages. It writes
// nothing when ctx carries no trace context.
func (a *Adapter) Inject(ctx context.Context, m *kafka.Message) {
	a.propagator.Inject(ctx, (*carrier)(&m.Headers))
}

// Extract returns ctx with the trace context that headers carry (as
// Inject wrote it) as its remote parent, through the Adapter's
// propagator; ctx itself when they carry none.
func (a *Adapter) Extract(ctx context.Context, headers []kafka.Header) context.Context {
	return a.propagator.Extract(ctx, (*carrier)(&headers))
}

// carrier is a propagation.TextMapCarrier over a Kafka message's headers.
// Get returns the last header of a key; Set replaces every header of the
// key with one. Header keys are case-sensitive in Kafka, and compared as
// they are.
type carrier []kafka.Header

var _ propagation.TextMapCarrier = (*carrier)(nil)

// Get returns the value of the last header named key, or "".
func (h *carrier) Get(key string) string {
	for i := len(*h) - 1; i >= 0; i-- {
		if (*h)[i].Key == key {
			return string((*h)[i].Value)
		}
	}
	return ""
}

// Set replaces the carrier named key with one of value.
func (h *carrier) Set(key, value string) {
	kept := (*h)[:0:0]
	for _, x := range *h {
		if x.Key != key {
			kept = append(kept, x)
		}
	}
	*h = append(kept, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys returns the carrier' keys, each once, in order.
func (h *carrier) Keys() []string {
	keys := make([]string, 0, len(*h))
	seen := map[string]bool{}
	for _, x := range *h {
		if !seen[x.Key] {
			seen[x.Key] = true
			keys = append(keys, x.Key)
		}
	}
	return keys
}

// headers is a read-only propagation.TextMapCarrier over the headers of
// an observe.Message, which an Observer must not modify: Set does
// nothing.
type headers []observe.Header

var _ propagation.TextMapCarrier = headers(nil)

// Get returns the value of the last header named key, or "".
func (h headers) Get(key string) string {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Key == key {
			return string(h[i].Value)
		}
	}
	return ""
}

// Set does nothing: the headers are the message's.
func (h headers) Set(string, string) {}

// Keys returns the headers' keys, each once, in order.
func (h headers) Keys() []string {
	keys := make([]string, 0, len(h))
	seen := map[string]bool{}
	for _, x := range h {
		if !seen[x.Key] {
			seen[x.Key] = true
			keys = append(keys, x.Key)
		}
	}
	return keys
}
