package entitlements

// Result is what the store did with one event or snapshot.
type Result struct {
	// Applied: the stored state is now the one given (written, or already
	// written by this same event).
	Applied bool
	// Stale: the stored state is newer (an older event or snapshot, or a
	// terminal status); nothing was written.
	Stale bool
	// Unordered: a same-second event that neither succeeds the stored
	// state nor is provably older, kept out because there was no API to
	// ask (entitlements_unordered_events_total).
	Unordered bool
	// Revalidated: a same-second event that could not be ordered was
	// settled by reading the object from Stripe and storing that state.
	Revalidated bool
	// StoredEventID is the event behind the row that was kept (Stale,
	// Unordered) or replaced, for the log line.
	StoredEventID string
	// Differs names the stored fields an unordered event disagreed on.
	Differs []Field
}
