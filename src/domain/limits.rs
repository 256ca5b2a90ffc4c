//! How large one Redis request may be: the cap on a request's arguments that serverless
//! managed Redis offerings set, and the arithmetic that cuts a list of items into requests
//! that each keep under it. Every request whose size grows with the configuration or the
//! data (a batch, its instances, the windows, a list of members) is cut by it, or bounded
//! by a constant checked against it where it is defined (docs/design.md, *Bounded calls*).

/// Most arguments one request to Redis may hold, the command's name counted as one
/// (`ZADD key GT 5 room42` holds five; `FCALL f 2 k1 k2 a` six): serverless managed Redis
/// refuses a request of more than 3 999. A script's own `redis.call`s are not requests
/// and are not counted here.
pub const MAX_REQUEST_ARGS: usize = 3_999;

/// How many items one request holds at most when it has `fixed` arguments of its own (its
/// command's name included) and `each` per item: as many as keep it within
/// [`MAX_REQUEST_ARGS`], at least one.
pub const fn per_request(fixed: usize, each: usize) -> usize {
    let room = MAX_REQUEST_ARGS.saturating_sub(fixed) / if each == 0 { 1 } else { each };
    if room == 0 {
        1
    } else {
        room
    }
}

/// Most members one `ranks` query asks for (`POST /v1/boards/{board}/ranks`, `rollboard
/// rank` with several members). The largest request it makes is the `above` read of a
/// sharded board: `FCALL`, the function, the key count, up to four keys, `above` and the
/// tie-break, then two arguments per member (2 009 at most).
pub const MAX_RANKS_MEMBERS: usize = 1_000;

const _: () = assert!(9 + 2 * MAX_RANKS_MEMBERS <= MAX_REQUEST_ARGS);

/// Most fields one event handed to `POST /v1/events` or `rollboard send` may carry (its
/// `id` included when it brings one). Its append holds two arguments per field and the
/// `id` one is given, and its dead letter, should it come to one, the same fields and the
/// letter's four beside `XADD`'s own six arguments: both stay within [`MAX_REQUEST_ARGS`].
pub const MAX_EVENT_FIELDS: usize = 1_000;

/// Most of an entry's own fields that its dead letter keeps: one `XADD … MAXLEN ~ n *`
/// (six arguments) of those fields and the letter's four (`reason`, `detail`, `source_id`,
/// `source_stream`), two arguments each. Only an entry added to the stream by hand can
/// carry more (the intake refuses more than [`MAX_EVENT_FIELDS`]); its letter keeps the
/// first ones and its `detail` says how many it left out.
pub const MAX_LETTER_FIELDS: usize = per_request(6 + 2 * 4, 2);

// One more for the `id` the intake gives an event without one.
const _: () = assert!(MAX_EVENT_FIELDS < MAX_LETTER_FIELDS);

#[cfg(test)]
mod tests {
    use super::*;

    /// Items per request fill it up to the cap exactly, and never leave a request empty.
    #[test]
    fn a_request_holds_as_many_items_as_the_cap_leaves_room_for() {
        assert_eq!(per_request(3, 2), 1_998);
        assert_eq!(3 + 2 * per_request(3, 2), MAX_REQUEST_ARGS);
        assert_eq!(per_request(2, 1), 3_997);
        // 4 + 5 × 799 = 3 999.
        assert_eq!(per_request(4, 5), 799);
        assert_eq!(per_request(5, 5), 798);
        // Nothing fits: one item a request all the same (the caller's own bound holds).
        assert_eq!(per_request(MAX_REQUEST_ARGS, 2), 1);
        assert_eq!(per_request(0, 0), MAX_REQUEST_ARGS);
    }

    /// A dead letter of as many fields as it keeps is one request within the cap.
    #[test]
    fn a_dead_letter_of_the_fields_it_keeps_fits_one_request() {
        // One field more would take it to 4 000.
        assert_eq!(MAX_LETTER_FIELDS, 1_992);
        assert_eq!(6 + 2 * (MAX_LETTER_FIELDS + 4), MAX_REQUEST_ARGS - 1);
    }
}
