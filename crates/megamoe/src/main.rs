fn main() {
    println!("megamoe: under construction");
}
