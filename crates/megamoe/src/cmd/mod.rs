//! One file per subcommand.

pub mod plan;
pub mod run;
