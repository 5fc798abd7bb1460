// Package telemetry starts the OpenTelemetry export of the example
// programs: over OTLP (package tracing/otlp) when one of the standard
// OTEL_EXPORTER_OTLP_*ENDPOINT variables is set, else nothing.
package telemetry

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/schedlock/schedlock/tracing/otlp"
)

// flushTimeout bounds the last export at the end of a program.
const flushTimeout = 5 * time.Second

// Start installs the OTLP export under the service name service when an
// endpoint is configured (otlp.Enabled), and returns the function that
// flushes and stops it, to call once everything that records spans has
// stopped. A failed flush is written to errOut, named after prog: it does
// not change a program's verdict. Without an endpoint, Start installs
// nothing and stop does nothing. Errors are otlp.Setup's.
func Start(ctx context.Context, service, prog string, errOut io.Writer) (stop func(), err error) {
	if !otlp.Enabled() {
		return func() {}, nil
	}
	shutdown, err := otlp.Setup(ctx, service)
	if err != nil {
		return nil, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			fmt.Fprintf(errOut, "%s: telemetry: %v\n", prog, err)
		}
	}, nil
}
