// Package otlp installs an OpenTelemetry SDK that exports the traces and
// metrics of schedlock (and of everything else in the program) over OTLP,
// to Jaeger or any OTLP backend, configured only from the standard OTEL_*
// environment variables.
//
// It is for applications, not libraries: Setup sets the global tracer
// provider, meter provider and propagator, which the redlock, scheduler and
// elector packages use unless given WithTracerProvider or WithMeterProvider.
// This is the only package of the module that imports the OpenTelemetry SDK
// and the OTLP exporters; the library packages and package tracing depend on
// the OpenTelemetry API only, so a program that does not import this
// package does not build the SDK, the exporters or gRPC.
//
// A program calls it once at start, and the returned shutdown once at the
// end, after everything that records spans has stopped:
//
//	if otlp.Enabled() {
//		shutdown, err := otlp.Setup(ctx, "my-service")
//		if err != nil {
//			return err
//		}
//		defer shutdown(context.WithoutCancel(ctx))
//	}
//
// # Environment
//
// The OTLP exporters, the SDK and its resource read the variables of the
// OpenTelemetry specification themselves; Setup adds the choice of
// protocol and exporter. Those that matter most:
//
//	OTEL_EXPORTER_OTLP_ENDPOINT   base URL of the collector, e.g.
//	                              http://127.0.0.1:4318 (http/protobuf) or
//	                              http://127.0.0.1:4317 (grpc); an http://
//	                              URL means no TLS. Per-signal variants:
//	                              OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
//	                              OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (full
//	                              URLs, with the /v1/traces path for http).
//	OTEL_EXPORTER_OTLP_PROTOCOL   http/protobuf (default) or grpc; per-signal
//	                              OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL
//	                              take precedence. http/json is not supported.
//	OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, ...
//	                              as in the specification.
//	OTEL_SERVICE_NAME             overrides Setup's serviceName.
//	OTEL_RESOURCE_ATTRIBUTES      more resource attributes (key=value,...).
//	OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG
//	                              the sampler (default parentbased_always_on).
//	OTEL_BSP_*                    the batch span processor (delay 5 s).
//	OTEL_METRIC_EXPORT_INTERVAL   the metric export period in ms (60000).
//	OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE
//	                              cumulative (default), delta or lowmemory.
//	OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER
//	                              otlp (default) or none: none installs no
//	                              provider for that signal. Jaeger accepts
//	                              traces only, so use
//	                              OTEL_METRICS_EXPORTER=none with a bare
//	                              Jaeger to avoid export errors.
//	OTEL_SDK_DISABLED=true        Setup installs nothing.
//
// Without any endpoint variable the exporters send to localhost (4318, or
// 4317 for grpc), as the specification says; Enabled reports whether an
// endpoint was given, for programs that export only when asked to.
//
// # Errors at run time
//
// Export failures (collector down, rejected data) do not reach the code
// that records spans: the SDK drops the data and reports the failure to
// the OpenTelemetry error handler (otel.SetErrorHandler), which logs it by
// default. Shutdown flushes what is left and returns the errors of that
// last export.
//
// docs/observability.md shows what schedlock exports and how to find lock
// contention in Jaeger.
package otlp
