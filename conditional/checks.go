package conditional

import (
	"context"
	"strconv"

	"github.com/nolock/nolock/internal/condcore"
)

// The argument checks shared with package dynamoconditional.
var (
	invalid  = condcore.Invalid
	validArg = condcore.ValidArg
	checkCtx = condcore.CheckCtx
	unsent   = condcore.Unsent
)

// unsentKey is unsent for op on key, whose message it builds only when
// ctx has ended (a take checks it on every call).
func unsentKey(ctx context.Context, op, key string) error {
	if ctx != nil && ctx.Err() == nil {
		return nil
	}
	return unsent(ctx, op+" "+strconv.Quote(key))
}
