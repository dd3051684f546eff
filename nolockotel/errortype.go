package nolockotel

import "github.com/nolock/nolock/internal/telemetry"

// ErrorTypeOther is error.type's value for an error ErrorType cannot
// name (OpenTelemetry's fallback).
const ErrorTypeOther = telemetry.ErrorTypeOther

// ErrorType is the default value of the error.type attribute for err, a
// few stable values per event:
//
//   - a sentinel error of nolock, by its qualified Go name
//     ("conditional.ErrSoldOut", "lease.ErrNotAcquired",
//     "idempotency.ErrMismatch"), and context.Canceled and
//     context.DeadlineExceeded by theirs;
//   - else the type of the first error of an exported type
//     ("*pgconn.PgError", "*inbox.HandlerError");
//   - else "_OTHER" (ErrorTypeOther).
//
// The sentinel nearest the top of err's tree (depth first, as errors.Is
// walks it) wins over any type: a *lease.HeldError, which wraps
// lease.ErrNotAcquired, is "lease.ErrNotAcquired", and a
// *conditional.HoldError "conditional.ErrHeld" or
// "conditional.ErrConfirmed". It returns "" for a nil err. The example
// services' and `nolock demo -metrics`' Prometheus text name errors the
// same way.
func ErrorType(err error) string { return telemetry.ErrorType(err) }
