//! farout-data
