package conditional

import "github.com/nolock/nolock/internal/condcore"

// The argument checks shared with package dynamoconditional.
var (
	invalid  = condcore.Invalid
	validArg = condcore.ValidArg
	checkCtx = condcore.CheckCtx
	unsent   = condcore.Unsent
)
