//! The command line: exit statuses, configuration precedence, JSON shapes, `send` and `drop-board`.

mod drop_board;
mod exit_codes_precedence_and_shapes;
mod send_all_or_nothing;
