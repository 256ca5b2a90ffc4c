//! Batches that touch many instances at once, through the consumer's own path
//! (`Consumer::process`): an unscoped board, a board scoped by room, and a board sharded
//! over three instances, fed the same events. A batch registers its scopes and shards
//! together (one `ZADD GT`) before it applies them, so this property drives batches of
//! many small instances, redeliveries of whole batches and of their first part (a
//! consumer stopped before its ack), events late for the window and rolls at advancing
//! times; after every step each instance (the resummarize board's after each roll, when
//! its job sums it), and the sharded board read as one, equal the model, event by event.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rollboard::domain::board::{Board, Mode};
use rollboard::ingest::stream::Entry;
use rollboard::metrics::Metrics;
use rollboard::store::Store;

use crate::support::asserts::side_by_side;
use crate::support::boards::{board, entry, ev, ingest_settings, roll_all, scoped, Consumer};
use crate::support::env::env_count;
use crate::support::keys::intake_stream;
use crate::support::model::{assert_matches, Instance};
use crate::support::proptests::run_cases;

const SLICE: i64 = 1_000;
const START: i64 = 1_763_700_000_000;

/// One step of a case.
#[derive(Debug, Clone)]
enum Step {
    /// A batch of new events: (room, fan, amount, seconds before now); each with an id of
    /// its own.
    Batch(Vec<(u8, u8, i64, i64)>),
    /// The last batch again, whole (`true`) or its first half (a consumer that applied
    /// part of it and stopped before its ack).
    Again(bool),
    /// Time moves on this many seconds and both jobs run.
    Roll(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop::collection::vec((1u8..=8, 1u8..=4, 1i64..=3, 0i64..=5), 1..40)
            .prop_map(Step::Batch),
        2 => any::<bool>().prop_map(Step::Again),
        2 => (1i64..=3).prop_map(Step::Roll),
    ]
}

/// The boards: `rooms` (unscoped), `fans` (scoped by room, resummarize) and `rooms_sh`
/// (`rooms` sharded over three instances), windows of four slices.
fn boards() -> Vec<Board> {
    let rooms = Board {
        member: "room".into(),
        ..board("rooms", SLICE, 4)
    };
    let fans = Board {
        mode: Mode::Resummarize,
        ..scoped(board("fans", SLICE, 4))
    };
    let sharded = Board {
        shards: 3,
        ..Board {
            name: "rooms_sh".into(),
            ..rooms.clone()
        }
    };
    vec![rooms, fans, sharded]
}

/// The model: every instance, by board name and scope.
#[derive(Default)]
struct Model {
    instances: BTreeMap<(String, Option<String>), Instance>,
}

impl Model {
    fn instance(&mut self, board: &str, scope: Option<&str>) -> &mut Instance {
        self.instances
            .entry((board.to_string(), scope.map(str::to_string)))
            .or_default()
    }
}

async fn run(store: &Store, steps: Vec<Step>) {
    let boards = boards();
    let (rooms, fans, sharded) = (&boards[0], &boards[1], &boards[2]);
    let settings = ingest_settings(intake_stream(), 1);
    let metrics = Metrics::new(&boards);
    let mut model = Model::default();
    let mut now = START;
    let mut last: Vec<Entry> = Vec::new();
    let mut seq = 0u64;
    // The events of each entry, for the model: (id, ts, room, fan, amount).
    let mut events: BTreeMap<String, (String, i64, String, String, i64)> = BTreeMap::new();
    for step in steps {
        let rolled = matches!(step, Step::Roll(_));
        let batch: Vec<Entry> = match step {
            Step::Batch(tips) => {
                last = tips
                    .iter()
                    .map(|&(room, fan, amount, ago)| {
                        seq += 1;
                        let id = format!("e{seq}");
                        let ts = now - ago * SLICE;
                        let (room, fan) = (format!("r{room}"), format!("f{fan}"));
                        events.insert(
                            id.clone(),
                            (id.clone(), ts, room.clone(), fan.clone(), amount),
                        );
                        entry(
                            &format!("{}-{seq}", now),
                            &[
                                ("id", &id),
                                ("room", &room),
                                ("user", &fan),
                                ("amount", &amount.to_string()),
                                ("ts", &ts.to_string()),
                            ],
                        )
                    })
                    .collect();
                last.clone()
            }
            Step::Again(whole) => {
                let n = if whole { last.len() } else { last.len() / 2 };
                last[..n].to_vec()
            }
            Step::Roll(seconds) => {
                now += seconds * SLICE;
                roll_all(store, &boards, now, 10).await;
                for ((name, _), instance) in model.instances.iter_mut() {
                    let board = boards.iter().find(|b| &b.name == name).expect("board");
                    instance.roll(&board.widest(), now);
                }
                Vec::new()
            }
        };
        if !batch.is_empty() {
            Consumer::new(store, &boards, &settings, &metrics)
                .process(intake_stream(), &batch, now)
                .await
                .expect("batch");
            for e in &batch {
                let id = std::str::from_utf8(&e.fields.as_ref().expect("fields")[0].1)
                    .expect("id")
                    .to_string();
                let (id, ts, room, fan, amount) = events[&id].clone();
                model.instance("rooms", None).apply(
                    &rooms.widest(),
                    &ev(&id, ts, &room, amount),
                    now,
                );
                model.instance("fans", Some(&room)).apply(
                    &fans.widest(),
                    &ev(&id, ts, &fan, amount),
                    now,
                );
            }
        }
        // A resummarize board's ranking changes when the job sums it: checked after rolls.
        for ((name, scope), instance) in &model.instances {
            let board = boards.iter().find(|b| &b.name == name).expect("board");
            if board.mode == Mode::Incremental || rolled {
                assert_matches(store, &board.widest(), scope.as_deref(), instance, now).await;
            }
        }
        // The sharded board, read as one, is the unscoped board: its ranking as the
        // model's, and every other answer as the unscoped board's.
        if let Some(instance) = model.instances.get(&("rooms".to_string(), None)) {
            assert_matches(store, &sharded.widest(), None, instance, now).await;
            same_answers(store, rooms, sharded, now).await;
        }
    }
}

/// An answer as JSON without the board's name.
fn unnamed(answer: impl serde::Serialize) -> serde_json::Value {
    let mut v = serde_json::to_value(answer).expect("json");
    v.as_object_mut().expect("an object").remove("board");
    v
}

/// `around` (radius 0 to 2) of every room and one never seen, and `ranks` of them all,
/// answer on `sharded` exactly as on `one`, the same ranking in one instance.
async fn same_answers(store: &Store, one: &Board, sharded: &Board, now: i64) {
    let mut rooms: Vec<String> = (1..=8).map(|r| format!("r{r}")).collect();
    rooms.push("nobody".into());
    for room in &rooms {
        for radius in 0..=2 {
            let (a, b) = side_by_side((&one.widest(), &sharded.widest()), |v| {
                store.around(v, None, room, radius, now)
            })
            .await;
            let (a, b) = match (a, b) {
                (Ok(a), Ok(b)) => (unnamed(a), unnamed(b)),
                (Err(a), Err(b)) => (unnamed(a), unnamed(b)),
                (a, b) => panic!("around {room} {radius}: {a:?} against {b:?}"),
            };
            assert_eq!(a, b, "around {room} radius {radius}");
        }
    }
    let asked: Vec<&str> = rooms.iter().map(String::as_str).collect();
    let (a, b) = side_by_side((&one.widest(), &sharded.widest()), |v| {
        store.ranks(v, None, &asked, now)
    })
    .await;
    assert_eq!(unnamed(a), unnamed(b), "ranks");
}

#[test]
fn batches_of_many_instances_match_the_model() {
    let cases = env_count("BATCHES_CASES", 24) as u32;
    run_cases(
        cases,
        &prop::collection::vec(step(), 1..12),
        async |store, steps| run(store, steps).await,
    );
}
